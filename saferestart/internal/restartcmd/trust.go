package restartcmd

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/preflight"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// TrustSnapshot computes the trust record of the apiserver about to be
// restarted, from the service-account key files its flags name, read now.
// Nil when the restart names no such files (nothing to record).
func TrustSnapshot(ctx context.Context, a *cmdkit.Env, p cmdkit.Preflight, cmFlagsFiles []string, log logrus.FieldLogger) *trust.Record {
	keyFiles, signing, err := ServiceAccountFiles(p)
	if err != nil {
		log.WithError(err).Error("cannot compute the trust record: none will be written for this restart")
		return nil
	}
	if len(keyFiles) == 0 {
		log.Debug("no service-account key file among the preflight files: no trust record")
		return nil
	}
	rec, err := trust.FromFiles(a.TrustHost(ctx), keyFiles, signing, time.Now())
	if err != nil {
		log.WithError(err).Error("cannot compute the trust record: none will be written for this restart")
		return nil
	}
	// kube-controller-manager's key, when its flags are given.
	if _, rec.ControllerManagerSigning, err = preflight.ControllerManagerKey(cmFlagsFiles); err != nil {
		log.WithError(err).Error("the trust record will not name kube-controller-manager's key: retire-keys cannot check it")
	}
	return &rec
}

// ServiceAccountFiles names the service-account key files and signing key
// of the restarted apiserver: from the flags files when there are any,
// otherwise the --preflight-file files holding keys (public ones are
// trusted, a private one is the signing key).
func ServiceAccountFiles(o cmdkit.Preflight) (keyFiles []string, signing string, err error) {
	if len(o.PreflightFlagsFiles) > 0 {
		return preflight.ServiceAccountFiles(o.PreflightFlagsFiles)
	}
	for _, p := range o.PreflightFiles {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, "", err
		}
		switch {
		case strings.Contains(string(data), "PRIVATE KEY-----"):
			signing = p
		case strings.Contains(string(data), "PUBLIC KEY-----"):
			keyFiles = append(keyFiles, p)
		}
	}
	return keyFiles, signing, nil
}

// writeTrust stores the record of a restart whose gate passed. A failure is
// logged, not fatal: the restart itself succeeded, and a missing record
// shows as a stale host in `trust` and in every wait.
func (r *restarter) writeTrust(ctx context.Context, cli *clientv3.Client, log logrus.FieldLogger, lockKey string, rec *trust.Record) {
	if rec == nil {
		return
	}
	tctx, cancel := r.OpCtx(ctx)
	defer cancel()
	switch err := trust.Put(tctx, cli, r.o.TrustPrefix, lockKey, *rec); {
	case errors.Is(err, trust.ErrLockGone):
		log.WithError(err).Error("restart done, but the lock was lost before the trust record was written: not recording it; this host shows as stale until its next restart")
	case err != nil:
		log.WithError(r.Etcd.Err(err)).Error("restart done, but the trust record could NOT be written: this host shows as stale until its next restart")
	default:
		log.WithFields(logrus.Fields{"trust_key": trust.Key(r.o.TrustPrefix, rec.Host), "trusted": strings.Join(rec.Trusted, ","), "signing": rec.Signing, "controller_manager_signing": rec.ControllerManagerSigning}).
			Info("trust record written")
	}
}

// trustGate runs before queueing for the lock: when this host is about to
// sign with a key it did not sign with at its last recorded restart (a
// rotation, a reimaged host), it waits until every other publishing host
// that has a trust record trusts that key, so that no token it signs is
// refused elsewhere. Hosts without a record are new themselves and load the
// bundle when they first start; waiting for them would deadlock a fleet
// coming up. The wait holds no lock, so the other hosts can restart.
func (r *restarter) trustGate(ctx context.Context, cli *clientv3.Client, log logrus.FieldLogger, snap *trust.Record) int {
	if snap == nil || snap.Signing == "" || r.o.TrustTimeout == 0 {
		return cmdkit.ExitOK
	}
	rctx, cancel := r.OpCtx(ctx)
	rep, err := trust.Collect(rctx, cli, r.o.TrustPrefixes())
	cancel()
	if err != nil {
		log.WithError(r.Etcd.Err(err)).Error("cannot read key trust")
		return cmdkit.ExitError
	}
	if own := rep.RecordOf(snap.Host); own != nil && own.Signing == snap.Signing {
		return cmdkit.ExitOK
	}
	exclude := []string{snap.Host}
	log = log.WithField("signing", snap.Signing)
	if others := rep.NotTrustingAmong(trust.Publishers, []string{snap.Signing}, append(exclude, rep.Unrecorded()...)); len(others) == 0 {
		return cmdkit.ExitOK
	}
	log.Infof("this apiserver will sign with a new key: waiting up to --trust-timeout %s, without the lock, until every other host trusts it", r.o.TrustTimeout)
	wctx, cancel := context.WithTimeout(ctx, r.o.TrustTimeout)
	defer cancel()
	_, err = trust.Wait(wctx, cli, trust.WaitOptions{Prefixes: r.o.TrustPrefixes(), Keys: []string{snap.Signing}, Exclude: exclude, SkipUnrecorded: true, OpTimeout: r.Etcd.CommandTimeout, Log: log})
	var nt *trust.NotTrustedError
	switch {
	case err == nil:
		log.Info("every other host trusts the new signing key")
		return cmdkit.ExitOK
	case cmdkit.Interrupted(ctx):
		log.Warn("interrupted while waiting for the new signing key to be trusted")
		return cmdkit.ExitInterrupted
	case errors.As(err, &nt):
		log.Errorf("new signing key %s not trusted by %s within --trust-timeout %s: not restarting (its tokens would be refused there)", snap.Signing, strings.Join(nt.Hosts, ", "), r.o.TrustTimeout)
		return cmdkit.ExitLockTimeout
	default:
		log.WithError(err).Error("waiting for the new signing key to be trusted")
		return cmdkit.ExitError
	}
}
