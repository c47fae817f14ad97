// Command etcd is the etcd server that the test bed's kube-apiserver stores its state in,
// built from the same go.etcd.io/etcd/server/v3 release that k8s.io/kubernetes v1.37.2
// requires (Debian 12 ships etcd 3.4, older than kube-apiserver 1.37 supports).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
