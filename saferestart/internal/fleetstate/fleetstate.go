// Package fleetstate reads the fleet's key, trust, hold, lock and rotation
// state from etcd, through the packages that own each record, and exports
// it as Prometheus gauges (kube_apiserver_safe_restart_...) from the
// registry of `publish-key --watch`. Every master's publisher exports the
// same fleet-wide view; alert rules aggregate it with max without(instance).
package fleetstate

import (
	"context"
	"fmt"

	"github.com/keysync/confd/internal/staletokens"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/rotation"
	"github.com/keysync/confd/saferestart/internal/status"
)

// PhaseNone is the rotation_phase label of a host with no rotation record,
// as `status` and rotate-key describe it ("none").
const PhaseNone = "none"

// Phases are the rotation_phase label's values, every one exported for
// every host: the phases of package rotation, then PhaseNone.
var Phases = []string{
	string(rotation.PhaseGenerated), string(rotation.PhasePublished), string(rotation.PhaseInstalling),
	string(rotation.PhaseInstalled), string(rotation.PhaseRetired), string(rotation.PhaseRollingBack), PhaseNone,
}

// Snapshot is the fleet state as one read found it: what `status` reports
// (the lock, the hold, the rotation records) and more.
type Snapshot struct {
	status.Report
	// Trust is the hosts × keys report `trust` prints, with every host's
	// published keys and key record (Lifecycle).
	Trust *trust.Report
	// StaleTokens are the stale-token records, by host.
	StaleTokens map[string]staletokens.Record
}

// Read reads the fleet state through the records' own readers: the keys,
// trust and rotation records under p, the lock lockName and the hold at
// holdKey (its default already applied).
func Read(ctx context.Context, kv hold.Client, p trust.Prefixes, lockName, holdKey string) (*Snapshot, error) {
	st, err := status.Collect(ctx, kv, lockName, holdKey, p.Rotation)
	s := &Snapshot{}
	if err == nil {
		s.Report = *st
		s.Trust, err = trust.Collect(ctx, kv, p)
	}
	// An unparseable stale-token record is left out: its sampler rewrites
	// it, and `retire-keys` names it.
	if err == nil {
		s.StaleTokens, _, err = staletokens.List(ctx, kv, p.Rotation)
	}
	if err != nil {
		return nil, fmt.Errorf("fleet state: %w", err)
	}
	return s, nil
}

// host is what the snapshot says of one host.
type host struct {
	// From its row in the trust report: how many keys it publishes, its
	// trust record (nil: none).
	published int
	record    *trust.Record
	rotation  rotation.HostRecords // Host "": no rotation record
}

// hosts is every host with a published value, a key record (the trust
// report lists the hosts with a value or a trust record; a host with a key
// record alone, forgotten with every key retired, is in its Lifecycle), a
// trust record or a rotation record, by name.
func (s *Snapshot) hosts() map[string]host {
	out := map[string]host{}
	for h := range s.Trust.Lifecycle {
		out[h] = host{}
	}
	for _, h := range s.Trust.Hosts {
		out[h.Host] = host{published: len(h.Publishes), record: h.Record}
	}
	for _, r := range s.Rotations {
		h := out[r.Host]
		h.rotation = r
		out[r.Host] = h
	}
	delete(out, "")
	return out
}
