package trust

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
)

// NotTrustedError is a wait that ended with hosts still not trusting the keys.
type NotTrustedError struct {
	Keys  []string
	Hosts []string
	Err   error // why the wait ended (deadline, cancellation, etcd)
}

func (e *NotTrustedError) Error() string {
	return fmt.Sprintf("key %s not trusted by %s: %v", strings.Join(e.Keys, ", "), strings.Join(e.Hosts, ", "), e.Err)
}

func (e *NotTrustedError) Unwrap() error { return e.Err }

// WaitOptions tune Wait.
type WaitOptions struct {
	Prefixes Prefixes
	Keys     []string // key IDs every host must trust
	// Among names the hosts waited for (default Publishers). With
	// Recorded, Prefixes.Keys is neither read nor watched.
	Among   Among
	Exclude []string // hosts not waited for
	// SkipUnrecorded: do not wait for hosts that have no trust record at
	// all (new hosts, or keys published for a host that does not run this
	// tool): they load the bundle when they first start, and waiting for
	// them would never end.
	SkipUnrecorded bool
	// OpTimeout bounds each etcd read (default 5s).
	OpTimeout time.Duration
	// RetryDelay is the pause before reading again after etcd failed
	// (default 1s). Otherwise Wait is woken by etcd watch events only.
	RetryDelay time.Duration
	// Client, when Wait is given no client, returns it; its failure is
	// retried as a failed read is (a caller may start before etcd answers).
	Client func(context.Context) (*clientv3.Client, error)
	Log    logrus.FieldLogger
}

// Wait returns once every host among o.Among (by default every host that
// publishes keys under the keys prefix), except those excluded, has a trust
// record listing every one of o.Keys. It reads at one revision and then
// sleeps on a watch of the prefixes read, so it wakes on the record that
// completes the set, not on a timer. When ctx ends first it returns a
// *NotTrustedError naming the hosts still missing. The report it returns is
// the last one read (nil if none could be).
func Wait(ctx context.Context, cli *clientv3.Client, o WaitOptions) (*Report, error) {
	if o.OpTimeout <= 0 {
		o.OpTimeout = 5 * time.Second
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = time.Second
	}
	log := o.Log
	if log == nil {
		l := logrus.New()
		l.Out = nopWriter{}
		log = l
	}
	var last *Report
	var lastMissing []string
	etcdDown := false
	fail := func(err error) (*Report, error) {
		hosts := lastMissing
		if last == nil {
			hosts = []string{"(unknown: etcd not read)"}
		}
		return last, &NotTrustedError{Keys: o.Keys, Hosts: hosts, Err: err}
	}
	for {
		var rep *Report
		var err error
		if cli == nil {
			cli, err = o.Client(ctx)
		}
		if err == nil {
			rep, err = o.collect(ctx, cli)
		}
		if err != nil {
			if ctx.Err() != nil {
				return fail(ctx.Err())
			}
			if !etcdDown {
				log.WithError(err).Warn("cannot read key trust from etcd: retrying until the wait ends")
				etcdDown = true
			}
			t := time.NewTimer(o.RetryDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return fail(ctx.Err())
			case <-t.C:
			}
			continue
		}
		if etcdDown {
			log.Info("key trust readable from etcd again")
			etcdDown = false
		}
		last = rep
		exclude := o.Exclude
		if o.SkipUnrecorded {
			exclude = append(slices.Clone(exclude), rep.Unrecorded()...)
		}
		missing := rep.NotTrustingAmong(o.Among, o.Keys, exclude)
		if len(missing) == 0 {
			return rep, nil
		}
		if !slices.Equal(missing, lastMissing) {
			log.WithFields(logrus.Fields{"keys": strings.Join(o.Keys, ","), "hosts": strings.Join(missing, ",")}).
				Infof("waiting for %s to trust key %s", strings.Join(missing, ", "), strings.Join(o.Keys, ", "))
			lastMissing = missing
		}
		if err := o.waitChange(ctx, cli, rep.Revision); err != nil && ctx.Err() != nil {
			return fail(ctx.Err())
		}
	}
}

// collect reads the report the wait looks at, within o.OpTimeout.
func (o *WaitOptions) collect(ctx context.Context, cli *clientv3.Client) (*Report, error) {
	rctx, cancel := context.WithTimeout(ctx, o.OpTimeout)
	defer cancel()
	if o.Among == Recorded {
		return CollectRecorded(rctx, cli, o.Prefixes.Trust)
	}
	return Collect(rctx, cli, o.Prefixes)
}

// waitChange returns at the first change under a prefix read after rev,
// or when a watch fails (the caller then reads again).
func (o *WaitOptions) waitChange(ctx context.Context, cli *clientv3.Client, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	var keys clientv3.WatchChan // nil, never ready, when the keys are not read
	if o.Among != Recorded {
		keys = cli.Watch(wctx, etcdkey.Dir(o.Prefixes.Keys), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	}
	trust := cli.Watch(wctx, etcdkey.Dir(o.Prefixes.Trust), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	var resp clientv3.WatchResponse
	var ok bool
	select {
	case <-ctx.Done():
		return ctx.Err()
	case resp, ok = <-keys:
	case resp, ok = <-trust:
	}
	if !ok {
		return errors.New("watch closed")
	}
	return resp.Err()
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }
