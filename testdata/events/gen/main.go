// Command gen regenerates the KV-event ingest fixtures in testdata/events
// (payloads/, manifest.json, scenarios.json) from the table in
// internal/testkit/eventfixtures:
//
//	go run ./testdata/events/gen            # from the repository root
//	go run ./testdata/events/gen -dir DIR   # somewhere else
//
// Review the diff afterwards; internal/testkit/eventfixtures' test fails until the
// committed files match the table again.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventfixtures"
)

func main() {
	dir := flag.String("dir", "testdata/events", "directory to write the fixtures into")
	flag.Parse()
	n, err := eventfixtures.Write(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("wrote %d files to %s\n", n, *dir)
}
