// Command etcd is etcd's own main (go.etcd.io/etcd/v3 main.go) built against the etcd server
// version that the pinned Kubernetes release is tested with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
