package kvload

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
)

// TestLoad loads a set that ends in a partial transaction and reads it back.
func TestLoad(t *testing.T) {
	s := etcdtest.Start(t)
	cli := s.Client(t)
	const n = 3*TxnOps + 5
	rev, err := Load(context.Background(), cli, n, func(i int) (string, string) {
		return fmt.Sprintf("/load/%04d", i), fmt.Sprint(i)
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(context.Background(), "/load/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != n || string(resp.Kvs[n-1].Value) != fmt.Sprint(n-1) {
		t.Fatalf("%d keys loaded, want %d", len(resp.Kvs), n)
	}
	// One revision per transaction: the puts were batched.
	if rev != resp.Header.Revision || rev > 1+4 {
		t.Errorf("last revision %d (now %d): want 4 transactions after revision 1", rev, resp.Header.Revision)
	}

	// A transaction etcd refuses is an error naming the keys.
	_, err = Load(context.Background(), cli, 2, func(i int) (string, string) { return "", "" })
	if err == nil {
		t.Error("Load of empty keys succeeded")
	}
}
