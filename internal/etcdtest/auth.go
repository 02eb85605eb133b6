package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// EnableAuth creates user root (password rootPassword) and a read-only user
// name/password limited to keys under prefix, then turns authentication on.
func (s *Server) EnableAuth(t testing.TB, rootPassword, name, password, prefix string) {
	t.Helper()
	s.enableAuth(t, rootPassword, name, password, [][2]string{{prefix, clientv3.GetPrefixRangeEnd(prefix)}})
}

// EnableAuthExact is EnableAuth with a least-privilege reader: granted each
// key itself and the keys below "key/", never a range wider than that
// ("/foo" but not "/foobar").
func (s *Server) EnableAuthExact(t testing.TB, rootPassword, name, password string, keys ...string) {
	t.Helper()
	var ranges [][2]string
	for _, k := range keys {
		ranges = append(ranges, [2]string{k, ""}, [2]string{k + "/", clientv3.GetPrefixRangeEnd(k + "/")})
	}
	s.enableAuth(t, rootPassword, name, password, ranges)
}

func (s *Server) enableAuth(t testing.TB, rootPassword, name, password string, ranges [][2]string) {
	t.Helper()
	cli := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", rootPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "reader"); return err },
		func() error {
			for _, r := range ranges {
				if _, err := cli.RoleGrantPermission(ctx, "reader", r[0], r[1], clientv3.PermissionType(clientv3.PermRead)); err != nil {
					return err
				}
			}
			return nil
		},
		func() error { _, err := cli.UserAdd(ctx, name, password); return err },
		func() error { _, err := cli.UserGrantRole(ctx, name, "reader"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("enable auth, step %d: %v", i, err)
		}
	}
}

// PutAs writes key=value as user (once authentication is on).
func (s *Server) PutAs(t testing.TB, user, password, key, value string) int64 {
	t.Helper()
	cfg := s.ClientConfig()
	cfg.Username, cfg.Password = user, password
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("etcd client as %s: %v", user, err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Put(ctx, key, value)
	if err != nil {
		t.Fatalf("put %s as %s: %v", key, user, err)
	}
	return resp.Header.Revision
}
