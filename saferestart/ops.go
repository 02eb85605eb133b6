package saferestart

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/pemcheck"
	"github.com/keysync/confd/internal/preflight"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/status"
)

// check validates files for confd's check_cmd: exit 0 valid, ExitPreflight
// with the reason on stderr otherwise. It needs etcd only with
// --require-signing-keys, and then exits ExitError when etcd does not
// answer: the bundle is refused either way.
func (o *checkCmd) Run(ctx context.Context, a *cmdkit.Env) int {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// What check accepts but an operator should fix (an RSA key under 2048
	// bits already published: refusing it would refuse the tokens it signed).
	warn := func(err error) { fmt.Fprintf(a.Stderr, "%s check: warning: %v\n", cmdkit.ProgName, err) }
	var errs []error
	if len(o.Argv) > 0 {
		errs = append(errs, preflight.CheckFiles(cctx, o.Argv, preflight.CheckOptions{
			PublicOnly: o.PublicOnly, KeysOnly: o.KeysOnly, RequireKeys: o.RequireKeys,
			// This host's own key, missing, is fixed by publishing it: for
			// these paths (the defaults publish-key reads, or the key given
			// by --signing-key) the error says so.
			OwnKeys: []string{cmdkit.DefaultSigningKey, cmdkit.DefaultPublicKey, o.SigningKey},
			Now:     time.Now(), Warn: warn,
		}))
	}
	// A staged kube-apiserver flags file is checked like a restart's
	// preflight: every PEM file it names must suit its flag.
	if len(o.PreflightFiles)+len(o.PreflightFlagsFiles) > 0 {
		errs = append(errs, preflight.Run(cctx, cmdkit.PreflightInput(o.Preflight, o.SigningKey, warn)))
	}
	var etcdErr error
	if o.RequireSigningKeys {
		var missing []error
		missing, etcdErr = o.signingKeysMissing(cctx, a, o.Argv)
		errs = append(errs, missing...)
	}
	for _, w := range duplicateKeys(o.Argv) {
		fmt.Fprintf(a.Stderr, "%s check: warning: %s\n", cmdkit.ProgName, w)
	}
	code := cmdkit.ExitOK
	if err := errors.Join(errs...); err != nil {
		for _, e := range cmdkit.SplitErrors(err) {
			fmt.Fprintf(a.Stderr, "%s check: invalid: %v\n", cmdkit.ProgName, e)
		}
		code = cmdkit.ExitPreflight
	}
	if etcdErr != nil {
		fmt.Fprintf(a.Stderr, "%s check: refused: %v; check etcd and the settings in --config, confd keeps the live file and retries\n", cmdkit.ProgName, etcdErr)
		code = cmdkit.ExitError
	}
	return code
}

// duplicateKeys names every key that a bundle file holds more than once,
// as kube-apiserver reads it (a certificate counts as its key). Only a
// warning: two hosts publishing the same key (one sa.key shared, as
// kubeadm makes it) is legitimate; anything else is a publisher's mistake
// worth a look.
func duplicateKeys(files []string) []string {
	var out []string
	for _, path := range files {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // CheckFiles reports it
		}
		lines := map[string][]string{}
		var order []string
		for _, k := range pemcheck.APIServerKeys(data) {
			kid, err := pemcheck.KeyID(k.Public)
			if err != nil {
				continue
			}
			if lines[kid] == nil {
				order = append(order, kid)
			}
			lines[kid] = append(lines[kid], strconv.Itoa(k.Line))
		}
		for _, kid := range order {
			if l := lines[kid]; len(l) > 1 {
				out = append(out, fmt.Sprintf("%s: key %s appears %d times (lines %s): harmless when several hosts publish the same key (a shared sa.key); otherwise a host publishes its key twice", path, kid, len(l), strings.Join(l, ", ")))
			}
		}
	}
	return out
}

// Run is the `status` subcommand: exit 4 while a hold is active.
func (o *statusCmd) Run(ctx context.Context, a *cmdkit.Env) int {
	return a.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
		sctx, cancel := context.WithTimeout(ctx, a.Etcd.CommandTimeout)
		defer cancel()
		r, err := status.Collect(sctx, cli, o.LockName, o.HoldKeyOrDefault(), o.RotationPrefix)
		if err == nil {
			err = r.AddKeys(sctx, cmdkit.KeyStore(cli, o.KeysPrefix, o.RotationPrefix))
		}
		if err != nil {
			a.Log.WithError(a.Etcd.Err(err)).Error("status")
			return cmdkit.ExitError
		}
		write := r.WriteText
		if o.Output == "json" {
			write = r.WriteJSON
		}
		if err := write(a.Stdout); err != nil {
			a.Log.WithError(err).Error("write status")
			return cmdkit.ExitError
		}
		// A script or monitoring check tells "the line is stopped" from
		// "all clear" by the code, as restart's refusal does (4).
		if r.Hold != nil {
			return cmdkit.ExitHold
		}
		return cmdkit.ExitOK
	})
}

func (o *holdCmd) Run(ctx context.Context, a *cmdkit.Env) int {
	return a.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
		hctx, cancel := context.WithTimeout(ctx, a.Etcd.CommandTimeout)
		defer cancel()
		key := o.HoldKeyOrDefault()
		// The operator behind sudo, else the user running it.
		user := cmp.Or(os.Getenv("SUDO_USER"), os.Getenv("USER"), os.Getenv("LOGNAME"))
		rec := hold.Record{Host: a.Host, PID: os.Getpid(), User: user, Reason: o.Reason, Time: time.Now(), Lock: o.LockName}
		stored, err := hold.Add(hctx, cli, key, rec)
		if err != nil {
			a.Log.WithError(a.Etcd.Err(err)).Error("hold")
			return cmdkit.ExitError
		}
		if len(stored.Also) > 0 {
			fmt.Fprintf(a.Stdout, "a hold was already set; your reason is kept beside it\n")
		}
		fmt.Fprintf(a.Stdout, "hold set at %s: %s\nevery host now refuses to restart until `%s unhold`\n", key, stored, cmdkit.ProgName)
		return cmdkit.ExitOK
	})
}

func (o *unholdCmd) Run(ctx context.Context, a *cmdkit.Env) int {
	return a.WithClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
		hctx, cancel := context.WithTimeout(ctx, a.Etcd.CommandTimeout)
		defer cancel()
		key := o.HoldKeyOrDefault()
		prev, err := hold.Delete(hctx, cli, key)
		if err != nil {
			a.Log.WithError(a.Etcd.Err(err)).Error("unhold")
			return cmdkit.ExitError
		}
		if prev == nil {
			fmt.Fprintf(a.Stdout, "no hold at %s\n", key)
		} else {
			a.Log.WithField("hold_key", key).Infof("hold removed: %s", prev)
			fmt.Fprintf(a.Stdout, "hold removed from %s: %s\n", key, prev)
		}
		// A helper killed mid-restart left an intent that holds like a hold
		// (hold.Intent); unhold is the operator's word that its apiserver is
		// fine. Live intents are restarts under way: they clear themselves.
		gone, err := hold.ClearOrphans(hctx, cli, key)
		for _, in := range gone {
			r := in.AsHold()
			a.Log.WithField("intent_key", in.Key).Infof("orphaned restart intent removed: %s", &r)
			fmt.Fprintf(a.Stdout, "orphaned restart intent of %s removed from %s (started %s)\n", in.Host, in.Key, in.Started.UTC().Format(time.RFC3339))
		}
		if err != nil {
			a.Log.WithError(a.Etcd.Err(err)).Error("unhold: restart intents")
			return cmdkit.ExitError
		}
		return cmdkit.ExitOK
	})
}
