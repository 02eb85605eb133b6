package authoring

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/backends/file"
	"github.com/keysync/confd/internal/redact"
)

// ValidateOptions are Validate's inputs.
type ValidateOptions struct {
	MockData  string         // a JSON or YAML file, read as the file backend reads one
	Settings  apply.Settings // as the run would use them
	Resources []string       // -resource names; none means every resource
	Noop      bool           // print the change against the live destination instead of the file
	Out       io.Writer      // rendered files or changes
	Log       logrus.FieldLogger
}

// Validate renders every selected resource from the mock data and prints
// each result, private key bodies masked. It writes no file, runs no command
// and contacts no store. A template reading a key the mock data lacks fails
// with the key named (memkv's "key does not exist: /KEY"). The exit code is
// 0 when every resource loaded and rendered, 1 otherwise.
func Validate(ctx context.Context, opts ValidateOptions) int {
	log := opts.Log
	// The file backend reads flat maps of absolute keys ("/a/b": "v") and
	// nested maps alike, in JSON or YAML, and names file and line on a
	// parse error; reading everything once surfaces such an error up front.
	store, err := file.New([]string{opts.MockData}, "")
	if err == nil {
		_, _, err = store.GetValues(ctx, []string{"/"})
	}
	if err != nil {
		log.Errorf("-mock-data %s: %v", opts.MockData, err)
		return 1
	}
	s := opts.Settings
	s.Noop = true
	s.Log = log
	rs, errs := apply.LoadNamed(&s, opts.Resources)
	failed := len(errs) > 0
	for _, err := range errs {
		log.Error(err.Error())
	}
	confd := filepath.Join(s.ConfDir, "conf.d")
	for _, r := range rs {
		p, err := r.Plan(ctx, store)
		if err != nil {
			log.Error(err.Error())
			failed = true
			continue
		}
		if opts.Noop {
			if !p.Write {
				fmt.Fprintf(opts.Out, "%s: in sync (%s)\n", r.Dest, relTo(confd, r.File))
			} else {
				_, _ = opts.Out.Write(p.Diff(r.Dest, s.NoopShowSecrets))
			}
			p.Release()
			continue
		}
		fmt.Fprintf(opts.Out, "==> %s (%s) <==\n", r.Dest, relTo(confd, r.File))
		// Private key bodies masked: a dry run's output ends up in
		// terminals, tickets and CI logs.
		out := redact.String(string(p.Content.Bytes()))
		p.Release()
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out += "\n"
		}
		_, _ = io.WriteString(opts.Out, out)
	}
	if failed {
		return 1
	}
	return 0
}
