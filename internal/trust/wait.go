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

// retryDelay is the first pause before reading again after etcd failed; it
// doubles with each failure in a row, up to maxRetryDelay, so that a wait
// that outlives an etcd outage (a site's power cut) neither hammers it nor
// wakes late. Otherwise Wait is woken by etcd watch events only.
const retryDelay, maxRetryDelay = time.Second, 15 * time.Second

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
	// SkipSigningOf names a host whose trust record's signing key is not
	// waited for: a key that host already signed with at its last recorded
	// restart was trusted when it began to (wait-trusted --if-new-key).
	// Read from every report, so that it holds when etcd answers late.
	SkipSigningOf string
	// OpTimeout bounds each etcd read (default 5s).
	OpTimeout time.Duration
	// Client, when Wait is given no client, returns it; its failure is
	// retried as a failed read is (a caller may start before etcd answers).
	Client func(context.Context) (*clientv3.Client, error)
	// Announce, when set, is called after every read that leaves hosts to
	// wait for, with the keys still waited for: it makes sure the caller's
	// record of the wait exists, and returns a channel closed when that
	// record is lost (Wait then reads and calls it again). Its failure is
	// retried as a failed read is.
	Announce func(ctx context.Context, cli *clientv3.Client, keys []string) (<-chan struct{}, error)
	Log      logrus.FieldLogger // required
}

// Wait returns once every host among o.Among (by default every host that
// publishes keys under the keys prefix), except those excluded, has a trust
// record listing every one of o.Keys. It reads at one revision and then
// sleeps on a watch of the prefixes read, so it wakes on the record that
// completes the set, not on a timer. While etcd does not answer it keeps
// trying, backing off, and logs when the outage starts and when it ends.
// When ctx ends first it returns a *NotTrustedError naming the hosts still
// missing. The report it returns is the last one read (nil if none could
// be).
func Wait(ctx context.Context, cli *clientv3.Client, o WaitOptions) (*Report, error) {
	if o.OpTimeout <= 0 {
		o.OpTimeout = 5 * time.Second
	}
	var last *Report
	var lastMissing []string
	var downSince time.Time // zero while etcd answers
	delay := retryDelay
	fail := func(err error) (*Report, error) {
		hosts := lastMissing
		if last == nil {
			hosts = []string{"(unknown: etcd not read)"}
		}
		return last, &NotTrustedError{Keys: o.Keys, Hosts: hosts, Err: err}
	}
	for {
		var rep *Report
		var lost <-chan struct{}
		var err error
		if cli == nil {
			cli, err = o.Client(ctx)
		}
		if err == nil {
			rep, err = o.collect(ctx, cli)
		}
		keys := o.Keys
		var missing []string
		if err == nil {
			keys = o.waitedFor(rep)
			exclude := o.Exclude
			if o.SkipUnrecorded {
				exclude = append(slices.Clone(exclude), rep.Unrecorded()...)
			}
			missing = rep.NotTrustingAmong(o.Among, keys, exclude)
			if len(missing) > 0 && o.Announce != nil {
				lost, err = o.Announce(ctx, cli, keys)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return fail(ctx.Err())
			}
			if downSince.IsZero() {
				o.Log.WithError(err).Warnf("etcd does not answer: retrying (backing off up to %s) until the wait ends", maxRetryDelay)
				downSince = time.Now()
			}
			select {
			case <-ctx.Done():
				return fail(ctx.Err())
			case <-time.After(delay):
			}
			delay = min(2*delay, maxRetryDelay)
			continue
		}
		if !downSince.IsZero() {
			o.Log.Infof("etcd answers again, after %s", time.Since(downSince).Round(time.Second))
			downSince, delay = time.Time{}, retryDelay
		}
		last = rep
		if len(missing) == 0 {
			return rep, nil
		}
		if !slices.Equal(missing, lastMissing) {
			o.Log.WithFields(logrus.Fields{"keys": strings.Join(keys, ","), "hosts": strings.Join(missing, ",")}).
				Infof("waiting for %s to trust key %s", strings.Join(missing, ", "), strings.Join(keys, ", "))
			lastMissing = missing
		}
		if err := o.waitChange(ctx, cli, rep.Revision, lost); err != nil && ctx.Err() != nil {
			return fail(ctx.Err())
		}
	}
}

// waitedFor is o.Keys without the key o.SkipSigningOf signed with at its
// last recorded restart.
func (o *WaitOptions) waitedFor(rep *Report) []string {
	own := rep.RecordOf(o.SkipSigningOf) // nil for "": no host is named ""
	if own == nil || own.Signing == "" {
		return o.Keys
	}
	return slices.DeleteFunc(slices.Clone(o.Keys), func(k string) bool { return k == own.Signing })
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
// when lost closes, or when a watch fails (the caller then reads again).
func (o *WaitOptions) waitChange(ctx context.Context, cli *clientv3.Client, rev int64, lost <-chan struct{}) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	var keys clientv3.WatchChan // nil, never ready, when the keys are not read
	if o.Among != Recorded {
		keys = cli.Watch(wctx, etcdkey.Dir(o.Prefixes.Keys), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	}
	trust := cli.Watch(wctx, etcdkey.Dir(o.Prefixes.Trust), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	// A key record changing (forget-host removing a host waited for) can
	// end the wait too; the rotation prefix's other records (this wait's
	// own waiting record among them) cannot, and do not wake it.
	var records clientv3.WatchChan
	if o.Among != Recorded && o.Prefixes.Rotation != "" {
		records = cli.Watch(wctx, etcdkey.Dir(o.Prefixes.Rotation), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	}
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case resp, ok = <-keys:
		case resp, ok = <-trust:
		case resp, ok = <-records:
			if ok && resp.Err() == nil && !slices.ContainsFunc(resp.Events, isKeyRecord) {
				continue
			}
		case <-lost:
			return nil
		}
		if !ok {
			return errors.New("watch closed")
		}
		return resp.Err()
	}
}

// isKeyRecord reports whether ev is a host's key record (PREFIX/HOST/kept).
func isKeyRecord(ev *clientv3.Event) bool { return strings.HasSuffix(string(ev.Kv.Key), "/kept") }
