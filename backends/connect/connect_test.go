package connect

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/etcdtest"
)

func TestNewUnknownBackend(t *testing.T) {
	_, err := New(context.Background(), backends.Config{Backend: "consul"})
	if err == nil {
		t.Fatal("New accepted backend consul")
	}
	for _, want := range []string{`"consul"`, "etcdv3", "etcd", "env", "file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestNewEnv(t *testing.T) {
	t.Setenv("KEYSYNC_NEWTEST_A", "1")
	c, err := New(context.Background(), backends.Config{Backend: "env"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, _, err := c.GetValues(context.Background(), []string{"/keysync/newtest"})
	if err != nil || !maps.Equal(got, map[string]string{"/keysync/newtest/a": "1"}) {
		t.Errorf("GetValues = %v, %v", got, err)
	}
	if _, ok := c.(interface {
		Watch(context.Context, []string, int64, func(backends.WatchEvent)) error
	}); ok || backends.CanWatch("env") {
		t.Error("the env backend claims it can watch")
	}
}

func TestNewFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("app: {port: 80}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.txt"), []byte("other: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := New(context.Background(), backends.Config{Backend: "file", YAMLFiles: []string{dir}, Filter: "*.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, _, err := c.GetValues(context.Background(), []string{"/"})
	if err != nil || !maps.Equal(got, map[string]string{"/app/port": "80"}) {
		t.Errorf("GetValues = %v, %v", got, err)
	}
	if _, err := New(context.Background(), backends.Config{Backend: "file"}); err == nil {
		t.Error("file backend without files accepted")
	}
}

func TestNewEtcdAuth(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	s.Put(t, "/app/key", "v")
	s.Put(t, "/secret", "s")
	const password = "reader-Pa55word"
	s.EnableAuth(t, "root-Pa55word", "reader", password, "/app")
	ctx := context.Background()
	// etcd checks passwords with bcrypt: five logins at once on a busy
	// 2-core machine take more than a second. This test is about outcomes.
	base := backends.Config{Nodes: []string{s.Endpoint}, DialTimeout: 15 * time.Second}

	for _, tc := range []struct {
		name      string
		backend   string
		basicAuth bool
	}{
		{"without -basic-auth", "etcdv3", false},
		{"with -basic-auth", "etcdv3", true},
		{"alias etcd", "etcd", false},
		{"default backend", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.Backend, cfg.BasicAuth, cfg.Username, cfg.Password = tc.backend, tc.basicAuth, "reader", password
			c, err := New(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			got, rev, err := c.GetValues(ctx, []string{"/app"})
			if err != nil || !maps.Equal(got, map[string]string{"/app/key": "v"}) || rev == 0 {
				t.Errorf("GetValues = %v, %d, %v", got, rev, err)
			}
			// Outside the user's permission: refused, and the error says where.
			if _, _, err := c.GetValues(ctx, []string{"/secret"}); err == nil || !strings.Contains(err.Error(), "/secret") {
				t.Errorf("GetValues(/secret) err = %v, want permission error naming the key", err)
			}
		})
	}

	t.Run("wrong password", func(t *testing.T) {
		t.Parallel()
		cfg := base
		cfg.Backend, cfg.Username, cfg.Password = "etcdv3", "reader", "Wr0ng-"+password
		_, err := New(ctx, cfg)
		if err == nil {
			t.Fatal("New succeeded with a wrong password")
		}
		msg := err.Error()
		if strings.Contains(msg, cfg.Password) || strings.Contains(msg, password) {
			t.Errorf("error reveals the password: %q", msg)
		}
		for _, want := range []string{"authentication", `"reader"`, s.Endpoint} {
			if !strings.Contains(msg, want) {
				t.Errorf("error %q does not mention %s", msg, want)
			}
		}
	})

	t.Run("no credentials", func(t *testing.T) {
		t.Parallel()
		cfg := base
		cfg.Backend = "etcdv3"
		_, err := New(ctx, cfg)
		if err == nil || !strings.Contains(err.Error(), "requires authentication") {
			t.Errorf("err = %v, want one saying authentication is required", err)
		}
	})
}

func TestNewEtcdUnreachable(t *testing.T) {
	t.Parallel()
	ep := etcdtest.UnusedEndpoint(t)
	start := time.Now()
	_, err := New(context.Background(), backends.Config{Backend: "etcdv3", Nodes: []string{ep}, DialTimeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), ep) {
		t.Errorf("err = %v, want one naming %s", err, ep)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("New took %s with a 300ms dial timeout", took)
	}
}
