package cli

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// tree is a root with a default command "run" taking --ttl (a value) and
// --dry (a bool), and "status" taking the etcd flags and -o.
func tree(p *Program, c *Common, e *Etcd, ran *[]string) *cobra.Command {
	root := p.Root(c, "prog", "test", "")
	var ttl int
	var dry bool
	var out string
	run := &cobra.Command{Use: "run", RunE: func(cmd *cobra.Command, args []string) error {
		*ran = append([]string{"run"}, args...)
		return nil
	}}
	run.Flags().IntVar(&ttl, "ttl", 10, "")
	run.Flags().BoolVar(&dry, "dry", false, "")
	status := &cobra.Command{Use: "status", RunE: func(cmd *cobra.Command, args []string) error {
		if err := p.Resolve(cmd, c, e, nil); err != nil {
			return err
		}
		*ran = []string{"status", strings.Join(e.Endpoints, ","), c.Origin["endpoints"], out}
		return Exit(7)
	}}
	e.Register(status.Flags())
	status.Flags().StringVarP(&out, "output", "o", "text", "")
	root.AddCommand(run, status)
	return root
}

// Flags before the subcommand, a bare invocation meaning the default
// command with its command after --, and unknown words and flags as
// usage errors (exit 2) with the closest name.
func TestDispatchAndExit(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		code int
		ran  []string
		err  string
	}{
		{args: nil, ran: []string{"run"}},
		{args: []string{"--ttl", "3", "--", "sh", "-c", "x"}, ran: []string{"run", "sh", "-c", "x"}},
		{args: []string{"--dry", "--", "status"}, ran: []string{"run", "status"}},
		{args: []string{"--endpoints", "x:1", "status"}, code: 7, ran: []string{"status", "x:1", "flag", "text"}},
		{args: []string{"-o", "json", "status"}, code: 7, ran: []string{"status", "127.0.0.1:2379", "default", "json"}},
		{args: []string{"status"}, env: map[string]string{"ETCDCTL_ENDPOINTS": "e:1"}, code: 7, ran: []string{"status", "e:1", "env ETCDCTL_ENDPOINTS", "text"}},
		{args: []string{"statsu"}, code: 2, err: `prog: unknown subcommand "statsu"; did you mean status?` + "\nRun 'prog --help' for usage.\n"},
		{args: []string{"status", "--endpoint", "x"}, code: 2, err: "unknown flag: --endpoint; did you mean --endpoints?"},
		{args: []string{"--ttl", "x"}, code: 2, err: `invalid argument "x" for "--ttl"`},
		{args: []string{"status", "--ttl", "3"}, code: 2, err: "unknown flag: --ttl for status (taken by run)"},
	} {
		var out, errb bytes.Buffer
		env := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
		p := &Program{Name: "prog", Stdout: &out, Stderr: &errb, LookupEnv: env}
		var ran []string
		root := tree(p, &Common{}, &Etcd{}, &ran)
		args, err := Dispatch(root, tc.args, "run")
		code := ExitUsage
		if err == nil {
			code = p.Execute(root, args)
		} else {
			p.Execute(&cobra.Command{RunE: func(*cobra.Command, []string) error { return err }}, nil)
		}
		if code != tc.code || !slices.Equal(ran, tc.ran) || !strings.Contains(errb.String(), tc.err) {
			t.Errorf("%q: exit %d ran %q stderr %q; want %d %q %q", tc.args, code, ran, errb.String(), tc.code, tc.ran, tc.err)
		}
	}
}

// --help alone is the root's help (the commands), on stdout; a
// subcommand's lists only its own flags and the shared ones.
func TestHelp(t *testing.T) {
	var out, errb bytes.Buffer
	p := &Program{Name: "prog", Stdout: &out, Stderr: &errb, LookupEnv: func(string) (string, bool) { return "", false }}
	var ran []string
	root := tree(p, &Common{}, &Etcd{}, &ran)
	args, err := Dispatch(root, []string{"--help"}, "run")
	if err != nil || p.Execute(root, args) != ExitOK || !strings.Contains(out.String(), "status") || errb.Len() != 0 {
		t.Fatalf("--help: %v stdout %q stderr %q", err, out.String(), errb.String())
	}
	// A line that, without --help, would run the default command asks for
	// its help: one with its flags, or with a command after --.
	for _, line := range [][]string{{"--ttl", "3", "--help"}, {"--dry", "-h"}, {"--help", "--", "true"}} {
		out.Reset()
		root = tree(p, &Common{}, &Etcd{}, &ran)
		args, err = Dispatch(root, line, "run")
		if err != nil || p.Execute(root, args) != ExitOK || !strings.Contains(out.String(), "--ttl") || errb.Len() != 0 {
			t.Fatalf("%q: %v stdout %q stderr %q", line, err, out.String(), errb.String())
		}
	}
	out.Reset()
	root = tree(p, &Common{}, &Etcd{}, &ran)
	args, _ = Dispatch(root, []string{"status", "-h"}, "run")
	if p.Execute(root, args) != ExitOK || !strings.Contains(out.String(), "--endpoints") || strings.Contains(out.String(), "--ttl") ||
		!strings.Contains(out.String(), "--config") {
		t.Fatalf("status -h: %s", out.String())
	}
}

// The file sets what neither a flag nor the environment set; keys the
// command has no flag for are ignored; a bad value names the file's line.
func TestConfigPrecedence(t *testing.T) {
	path := t.TempDir() + "/c.toml"
	if err := os.WriteFile(path, []byte("endpoints = [\"f:1\"]\ndial-timeout = \"9s\"\nttl = 5\nsocket = \"/x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	env := map[string]string{"ETCDCTL_DIAL_TIMEOUT": "3s"}
	p := &Program{Name: "prog", Stdout: &out, Stderr: &errb, LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	var ran []string
	c, e := &Common{}, &Etcd{}
	root := tree(p, c, e, &ran)
	args, _ := Dispatch(root, []string{"status", "--config", path}, "run")
	if code := p.Execute(root, args); code != 7 || ran[1] != "f:1" || e.DialTimeout != 3*time.Second || e.From != "from "+path+":1" {
		t.Fatalf("exit %d ran %q dial %s from %q; stderr %s", code, ran, e.DialTimeout, e.From, errb.String())
	}
	if err := os.WriteFile(path, []byte("dial-timeout = \"soon\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	root = tree(p, &Common{}, &Etcd{}, &ran)
	args, _ = Dispatch(root, []string{"status", "--config", path}, "run")
	if code := p.Execute(root, args); code != ExitUsage || !strings.Contains(errb.String(), path+":1") {
		t.Fatalf("exit %d stderr %s", code, errb.String())
	}
}

// CAFrom names where --cacert's value came from, for the etcd client's
// "unknown authority": the setting to fix is the one the operator used.
func TestCAFrom(t *testing.T) {
	path := t.TempDir() + "/c.toml"
	if err := os.WriteFile(path, []byte("cacert = \"/file/ca.crt\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"status"}, nil, "--cacert"},
		{[]string{"status", "--cacert", "/flag/ca.crt"}, map[string]string{"ETCDCTL_CACERT": "/env/ca.crt"}, "--cacert"},
		{[]string{"status"}, map[string]string{"ETCDCTL_CACERT": "/env/ca.crt"}, "ETCDCTL_CACERT"},
		{[]string{"status", "--config", path}, nil, "--cacert (" + path + ":1)"},
	} {
		var out, errb bytes.Buffer
		p := &Program{Name: "prog", Stdout: &out, Stderr: &errb, LookupEnv: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }}
		var ran []string
		e := &Etcd{}
		root := tree(p, &Common{}, e, &ran)
		args, _ := Dispatch(root, tc.args, "run")
		if code := p.Execute(root, args); code != 7 || e.CAFrom != tc.want || e.caFlag() != tc.want {
			t.Errorf("%q %v: exit %d CAFrom %q, want %q; stderr %s", tc.args, tc.env, code, e.CAFrom, tc.want, errb.String())
		}
	}
	if got := (&Etcd{}).caFlag(); got != "--cacert" {
		t.Errorf("unresolved Etcd: %q", got)
	}
}
