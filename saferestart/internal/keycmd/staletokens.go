package keycmd

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/staletokens"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// StaleTokenSampler is the sampler the long-running publisher runs beside
// its reconcile loop when --apiserver-metrics-url is set (nil otherwise):
// this host's apiserver, read with the health gate's credentials, recorded
// under --rotation-prefix for --host.
func (o *PublishKey) StaleTokenSampler(ctx context.Context, a *cmdkit.Env, kv clientv3.KV) *staletokens.Sampler {
	if o.APIServerMetricsURL == "" {
		return nil
	}
	host := a.TrustHost(ctx)
	return &staletokens.Sampler{
		Client: staletokens.ClientConfig{URL: o.APIServerMetricsURL, CACert: o.HealthCACert, Cert: o.HealthCert,
			Key: o.HealthKey, TokenFile: o.HealthToken},
		KV: kv, Prefix: o.RotationPrefix, Host: host,
		Log: a.Log.WithField("host", host).WithField("sampler", "stale-tokens"),
	}
}

// staleTokenGate runs before retire-keys retires kid, superseded (it
// stopped signing) at since: while any apiserver's stale-token counter grew
// within --stale-token-window and more than an hour after since, a client
// may still present a token kid signed, which every apiserver would refuse
// once kid is retired, so kid is kept. That is not an error (exit 0, a
// warning naming hosts and times): the hourly timer retires kid once the
// counters stop growing, and must not fail every hour meanwhile.
// --ignore-stale-tokens retires it anyway, logging what it overrode.
func (r *retirer) staleTokenGate(kid string, since time.Time, log logrus.FieldLogger) bool {
	o := r.o
	v := staletokens.Decide(r.stale, r.hosts, since, time.Now(), o.StaleTokenWindow)
	if len(v.Unknown) > 0 {
		log.Infof("stale-token evidence about %s unknown on %s: not counted (run the sampler: --apiserver-metrics-url)", kid, v.UnknownString())
	}
	if len(v.Refusing) == 0 {
		return true
	}
	stopped := since.UTC().Format(time.RFC3339)
	if o.IgnoreStaleTokens {
		log.Warnf("--ignore-stale-tokens: retiring %s although stale service-account tokens were used on %s, within --stale-token-window %s and over an hour after it stopped signing (%s): clients still holding tokens it signed are refused once every apiserver drops it",
			kid, v, o.StaleTokenWindow, stopped)
		return true
	}
	log.Warnf("key %s is due, but stale service-account tokens were used on %s (%s grew within --stale-token-window %s, over an hour after %s stopped signing at %s): a client may still hold a token it signed; kept until no counter grows for that long (find the clients by the audit annotation authentication.k8s.io/stale-token), or pass --ignore-stale-tokens",
		kid, v, staletokens.CounterMetric, o.StaleTokenWindow, kid, stopped)
	return false
}
