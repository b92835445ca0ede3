// Command danglinghosts fails when a rendered manifest (helm template's
// output, one file per argument) points a workload at a host that no
// Service of the same rendering provides. scripts/check-deploy.sh runs it
// on the chart's default rendering and on the one with the chart's own
// etcd, so `helm install` with those values never waits on a Service it
// did not create (deploy/README.md).
package main

import (
	"fmt"
	"os"

	"github.com/mooncake-conductor-go/conductor/internal/deploycheck"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: danglinghosts RENDERED.yaml...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		b, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "danglinghosts:", err)
			os.Exit(2)
		}
		found, err := deploycheck.DanglingHosts(b)
		if err != nil {
			fmt.Fprintf(os.Stderr, "danglinghosts: %s: %v\n", path, err)
			os.Exit(2)
		}
		for _, d := range found {
			fmt.Fprintf(os.Stderr, "danglinghosts: %s: %s\n", path, d)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}
