// Command etcd is the etcd server, v3 as pinned in this directory's
// go.mod, built for the tests that need a real one (internal/testkit/etcdtest
// builds and starts it). It is a module of its own so that the service's
// module neither requires etcd's server nor compiles it: the service
// itself only speaks to etcd through its client.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
