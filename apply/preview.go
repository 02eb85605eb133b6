package apply

import (
	"context"

	"github.com/keysync/confd/internal/redact"
)

// Preview is what a resource would render, found without writing a file or
// running a command.
type Preview struct {
	Dest    string
	Content []byte // the rendered file, unmasked: callers print it through redact
	InSync  bool   // bytes, mode and owner equal the live destination
	Change  []byte // what -noop prints (mode, owner, unified diff), private keys masked; empty when in sync
}

// Masked is the rendered content with private key bodies masked, for
// printing: a dry run's output ends up in terminals, tickets and CI logs.
func (p Preview) Masked() string { return redact.String(string(p.Content)) }

// Preview renders r from store and compares the result with the live
// destination. It writes nothing and runs neither check_cmd nor reload_cmd.
func (r *File) Preview(ctx context.Context, store Getter) (Preview, error) {
	p, err := r.Plan(ctx, store)
	if err != nil {
		return Preview{}, err
	}
	defer p.Release()
	pv := Preview{Dest: r.Dest, Content: p.Content.Bytes(), InSync: !p.Write}
	if p.Write {
		pv.Change = p.Diff(r.Dest, r.s.NoopShowSecrets)
	}
	return pv, nil
}
