package status

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/lock"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

func TestWriteTextAndJSON(t *testing.T) {
	started := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	acq := started.Add(time.Minute)
	r := &Report{
		Lock: "l", Revision: 9, HoldKey: "l-hold",
		Holder: &lock.Entry{Key: "l/1a", Lease: "1a", CreateRevision: 3, Info: &lock.Info{Host: "m1", PID: 11, Started: started, Acquired: &acq}},
		Waiters: []lock.Entry{
			{Key: "l/2b", Lease: "2b", CreateRevision: 4},
			{Key: "l/3c", Lease: "3c", CreateRevision: 5, Info: &lock.Info{Host: "m3", PID: 33, Started: started}},
		},
		Hold: &hold.Record{Host: "m2", Reason: "health gate: 401 > bad", Time: started},
	}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "expires") {
		t.Errorf("advice without a TTL known:\n%s", b.String())
	}
	// With the TTL etcd reported, the holder's line says when a dead
	// host's lock frees itself.
	r.Holder.TTL = 42
	b.Reset()
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"holder:  l/1a (lease 1a, 42s left, created at revision 3): host m1 pid 11 started 2030-01-01T00:00:00Z holding since 2030-01-01T00:01:00Z\n" +
			"         its lease expires in 42s; if host m1 is gone, the lock frees itself then\n",
		"waiters: 2", "1. l/2b (lease 2b, created at revision 4): no holder info", "2. l/3c", "host m3 pid 33",
		"hold:    ACTIVE (l-hold): host m2 at 2030-01-01T00:00:00Z: health gate: 401 > bad",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Holder.Info.PID != 11 || len(back.Waiters) != 2 || back.Waiters[0].Info != nil || back.Hold.Reason != r.Hold.Reason || back.Holder.TTL != 42 {
		t.Fatalf("json round trip: %v\n%s", err, b.String())
	}
	if !strings.Contains(b.String(), "401 > bad") {
		t.Errorf("JSON escapes > needlessly:\n%s", b.String())
	}
	empty := &Report{Lock: "l", HoldKey: "l-hold", Waiters: []lock.Entry{}}
	b.Reset()
	_ = empty.WriteText(&b)
	if !strings.Contains(b.String(), "holder:  none") || !strings.Contains(b.String(), "waiters: none") || !strings.Contains(b.String(), "hold:    none") {
		t.Errorf("empty report:\n%s", b.String())
	}
}

// status shows each host's rotation phase, a running rotation, and an
// apiserver that waits for its key to be trusted (README: "status shows
// the lock, holds and rotations").
func TestWriteRotations(t *testing.T) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &Report{Lock: "l", HoldKey: "l-hold", Waiters: []lock.Entry{}, RotationPrefix: "/rot", Rotations: []rotation.HostRecords{
		{Host: "m1", State: &rotation.State{Host: "m1", Phase: rotation.PhaseInstalled, Next: "K2", Previous: "K1", Updated: at, RetireAfter: at.Add(time.Hour)}},
		{Host: "m2", Waiting: &rotation.Waiting{Host: "m2", Keys: []string{"K9"}, Since: at, PID: 7}},
		{Host: "m3", State: &rotation.State{Host: "m3", Phase: rotation.PhasePublished, Next: "K4", Previous: "K3", Updated: at}, Rotating: true},
		{Host: "m4", StateError: "/rot/m4/state is not a rotation record"},
	}}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"rotations: (/rot)\n",
		"  m1: phase installed (next K2, previous K1, updated 2030-01-01T00:00:00Z, previous key retired after 2030-01-01T01:00:00Z)\n",
		"  m2: no rotation recorded; its apiserver WAITS for key K9 to be trusted (wait-trusted since 2030-01-01T00:00:00Z, pid 7)\n",
		"  m3: phase published (next K4, previous K3, updated 2030-01-01T00:00:00Z); a rotate-key or retire-keys runs now\n",
		"  m4: state UNREADABLE: /rot/m4/state is not a rotation record\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back.Rotations) != 4 || back.Rotations[0].State.Phase != rotation.PhaseInstalled ||
		back.Rotations[1].Waiting.Keys[0] != "K9" || !back.Rotations[2].Rotating {
		t.Fatalf("json round trip: %v\n%s", err, b.String())
	}
	b.Reset()
	_ = (&Report{Lock: "l", HoldKey: "l-hold", RotationPrefix: "/rot"}).WriteText(&b)
	if !strings.Contains(b.String(), "rotations: none (/rot)") {
		t.Errorf("no rotations:\n%s", b.String())
	}
}

// status shows each host's current and superseded keys with their retire
// time, and a host forget-host removed as gone (text and JSON).
func TestWriteKeys(t *testing.T) {
	gone := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &Report{Lock: "l", HoldKey: "l-hold", RotationPrefix: "/rot", KeysPrefix: "/keys", Keys: []keystate.HostKeys{
		{Host: "m1", Current: []string{"K2"}, Superseded: []keystate.SupersededKey{{KID: "K1", RetireAfter: gone.Add(time.Hour), By: "rotate-key"}}},
		{Host: "m3", Current: []string{}, Superseded: []keystate.SupersededKey{{KID: "K3", RetireAfter: gone.Add(24 * time.Hour), By: "forget-host"}}, Forgotten: &gone},
	}}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"keys: (/keys)",
		"  m1: current K2; superseded K1 (by rotate-key, retired after 2030-01-01T01:00:00Z)",
		"  m3: GONE (forget-host 2030-01-01T00:00:00Z); superseded K3 (by forget-host, retired after 2030-01-02T00:00:00Z)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Keys []keystate.HostKeys `json:"keys"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil || len(got.Keys) != 2 || got.Keys[1].Forgotten == nil || got.Keys[0].Superseded[0].KID != "K1" {
		t.Fatalf("JSON keys %+v: %v\n%s", got.Keys, err, b.String())
	}
}
