package keystate

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keytest"
)

// keys are three EC keys, sorted by key ID (a < b < c).
func keys(t *testing.T) (a, b, c Item) {
	t.Helper()
	var items []Item
	for range 3 {
		k := keytest.EC(t)
		items = append(items, Item{KID: keytest.KeyID(t, k.Public()), PEM: keytest.PublicPEM(t, k.Public())})
	}
	SortItems(items)
	return items[0], items[1], items[2]
}

func state(items []Item, sup map[string]Superseded, retired map[string]time.Time) State {
	rec := Record{Host: "m1", Superseded: sup, Retired: retired}
	return State{Host: "m1", Items: items, Record: rec.clone()}
}

func TestPublish(t *testing.T) {
	a, b, c := keys(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	earlier := now.Add(-time.Hour)
	tests := []struct {
		name       string
		cur        State
		source     []Item
		grace      time.Duration
		wantValue  []string
		wantSup    map[string]time.Time // kid -> retire after
		wantErr    bool
		wantDroped []string
	}{
		{name: "first publish", cur: state(nil, nil, nil), source: []Item{a}, grace: time.Hour,
			wantValue: []string{a.KID}, wantSup: map[string]time.Time{}},
		{name: "unchanged", cur: state([]Item{a}, nil, nil), source: []Item{a}, grace: time.Hour,
			wantValue: []string{a.KID}, wantSup: map[string]time.Time{}},
		{name: "reimaged: old key superseded", cur: state([]Item{a}, nil, nil), source: []Item{b}, grace: time.Hour,
			wantValue: []string{a.KID, b.KID}, wantSup: map[string]time.Time{a.KID: now.Add(time.Hour)}},
		{name: "grace 0: superseded, not dropped", cur: state([]Item{a}, nil, nil), source: []Item{b},
			wantValue: []string{a.KID, b.KID}, wantSup: map[string]time.Time{a.KID: now}},
		{name: "retire time never recomputed",
			cur:    state([]Item{a, b}, map[string]Superseded{a.KID: {RetireAfter: earlier, PEM: string(a.PEM)}}, nil),
			source: []Item{b}, grace: 24 * time.Hour,
			wantValue: []string{a.KID, b.KID}, wantSup: map[string]time.Time{a.KID: earlier}},
		{name: "operator's edit healed from the record",
			cur:    state([]Item{b}, map[string]Superseded{a.KID: {RetireAfter: earlier, PEM: string(a.PEM)}}, nil),
			source: []Item{b}, grace: time.Hour,
			wantValue: []string{a.KID, b.KID}, wantSup: map[string]time.Time{a.KID: earlier}},
		{name: "source still holding a superseded key keeps it superseded",
			cur:    state([]Item{a, b}, map[string]Superseded{a.KID: {RetireAfter: earlier, PEM: string(a.PEM)}}, nil),
			source: []Item{a, b}, grace: time.Hour,
			wantValue: []string{a.KID, b.KID}, wantSup: map[string]time.Time{a.KID: earlier}},
		{name: "retired key in the source is left out",
			cur:    state([]Item{b}, nil, map[string]time.Time{a.KID: earlier}),
			source: []Item{a, b}, grace: time.Hour,
			wantValue: []string{b.KID}, wantSup: map[string]time.Time{}, wantDroped: []string{a.KID}},
		{name: "source of retired keys only is refused",
			cur:    state([]Item{b}, nil, map[string]time.Time{a.KID: earlier}),
			source: []Item{a}, grace: time.Hour, wantErr: true, wantDroped: []string{a.KID}},
		{name: "retired key in the current value is not superseded",
			cur:    state([]Item{a, b}, nil, map[string]time.Time{a.KID: earlier}),
			source: []Item{c}, grace: time.Hour,
			wantValue: []string{b.KID, c.KID}, wantSup: map[string]time.Time{b.KID: now.Add(time.Hour)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, dropped, err := tt.cur.Publish(tt.source, "publish-key", now, tt.grace)
			if !slices.Equal(dropped, tt.wantDroped) {
				t.Errorf("dropped %v, want %v", dropped, tt.wantDroped)
			}
			if tt.wantErr {
				if !errors.Is(err, ErrRetired) {
					t.Fatalf("err %v, want ErrRetired", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := KIDs(next.Items); !slices.Equal(got, tt.wantValue) {
				t.Errorf("value %v, want %v", got, tt.wantValue)
			}
			got := map[string]time.Time{}
			for kid, s := range next.Record.Superseded {
				got[kid] = s.RetireAfter
				if s.PEM == "" {
					t.Errorf("superseded %s without its PEM", kid)
				}
			}
			if len(got) != len(tt.wantSup) {
				t.Fatalf("superseded %v, want %v", got, tt.wantSup)
			}
			for kid, w := range tt.wantSup {
				if !got[kid].Equal(w) {
					t.Errorf("superseded %s retires after %s, want %s", kid, got[kid], w)
				}
			}
			// The input is never modified (Update retries from a fresh read).
			if len(tt.cur.Record.Superseded) > 0 && len(next.Record.Superseded) > len(tt.cur.Record.Superseded) {
				if _, ok := tt.cur.Record.Superseded[tt.source[0].KID]; ok {
					t.Error("the current state was modified")
				}
			}
		})
	}
}

func TestSupersedeAndRetire(t *testing.T) {
	a, b, _ := keys(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cur := state([]Item{a, b}, nil, nil)

	// rotate-key's install: a (the previous key) is superseded.
	inst, err := cur.Supersede(a.KID, now.Add(time.Hour), "rotate-key", "", now)
	if err != nil || inst.Record.Superseded[a.KID].PEM != string(a.PEM) || !inst.Record.Superseded[a.KID].RetireAfter.Equal(now.Add(time.Hour)) {
		t.Fatalf("supersede: %v %+v", err, inst.Record)
	}
	// A re-run keeps the first retire time.
	again, _ := inst.Supersede(a.KID, now.Add(5*time.Hour), "rotate-key", "", now)
	if !again.Record.Superseded[a.KID].RetireAfter.Equal(now.Add(time.Hour)) {
		t.Fatal("retire time recomputed")
	}
	// Due (retire-keys' rule: not before RetireAfter) after the grace only.
	if sup := again.Record.Superseded[a.KID]; !now.Before(sup.RetireAfter) || now.Add(time.Hour).Before(sup.RetireAfter) || len(again.Record.Superseded) != 1 {
		t.Fatalf("due before the grace, or not after it: %+v", again.Record.Superseded)
	}
	// --rollback: a signs again, b (rolled back) is superseded.
	back, err := again.Supersede(b.KID, now.Add(2*time.Hour), "rotate-key --rollback", a.KID, now)
	if err != nil || len(back.Record.Superseded) != 1 || back.Record.Superseded[b.KID].RetireAfter.IsZero() {
		t.Fatalf("rollback: %v %+v", err, back.Record)
	}
	// Retire b: tombstoned, out of the value.
	ret, err := back.Retire([]string{b.KID}, now)
	if err != nil || !slices.Equal(KIDs(ret.Items), []string{a.KID}) || ret.Record.Retired[b.KID].IsZero() || len(ret.Record.Superseded) != 0 {
		t.Fatalf("retire: %v %v %+v", err, KIDs(ret.Items), ret.Record)
	}
	// A rollback to a retired key is refused.
	if _, err := ret.Supersede(a.KID, now, "rotate-key --rollback", b.KID, now); !errors.Is(err, ErrRetired) {
		t.Fatalf("resume a retired key: %v", err)
	}
	// Retiring every key is refused.
	if _, err := ret.Retire([]string{a.KID}, now); err == nil {
		t.Fatal("retired the last key")
	}
}

// The record written before this package ({"host","keep":{kid:time}})
// reads as superseded keys whose PEM comes from the value.
func TestLegacyKeepRecord(t *testing.T) {
	a, b, _ := keys(t)
	until := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	legacy := []byte(`{"host":"m1","keep":{"` + a.KID + `":"` + until.Format(time.RFC3339) + `"}}`)
	rec, err := parseRecord("/r/m1/kept", "m1", legacy, []Item{a, b})
	if err != nil {
		t.Fatal(err)
	}
	s := rec.Superseded[a.KID]
	if !s.RetireAfter.Equal(until) || s.PEM != string(a.PEM) || s.By != Legacy || rec.Keep != nil {
		t.Fatalf("legacy record read as %+v", rec)
	}
	if _, err := parseRecord("/r/m1/kept", "m1", []byte("{"), nil); err == nil {
		t.Fatal("unparseable record accepted")
	}
}

// forget-host: every current key becomes superseded with now+grace (a key
// superseded before keeps its time), the host is marked forgotten once,
// and the value keeps every key until retire-keys.
func TestForget(t *testing.T) {
	a, b, _ := keys(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	earlier := now.Add(-time.Hour)
	cur := state([]Item{a, b}, map[string]Superseded{a.KID: {RetireAfter: earlier, PEM: string(a.PEM)}}, nil)
	next := cur.Forget("forget-host", now, 2*time.Hour)
	if !slices.Equal(KIDs(next.Items), []string{a.KID, b.KID}) {
		t.Fatalf("value %v: a forgotten host's keys stay published until retired", KIDs(next.Items))
	}
	if got := next.Record.Superseded[a.KID].RetireAfter; !got.Equal(earlier) {
		t.Errorf("already superseded key: retire after %s, want %s (never recomputed)", got, earlier)
	}
	if got := next.Record.Superseded[b.KID]; !got.RetireAfter.Equal(now.Add(2*time.Hour)) || got.By != "forget-host" || got.PEM != string(b.PEM) {
		t.Errorf("current key superseded as %+v, want retire after now+grace by forget-host with its PEM", got)
	}
	if !next.Record.Forgotten.Equal(now) || !cur.Record.Forgotten.IsZero() {
		t.Errorf("forgotten %s (before: %s), want %s", next.Record.Forgotten, cur.Record.Forgotten, now)
	}
	if again := next.Forget("forget-host", now.Add(time.Hour), time.Hour); !again.Record.Forgotten.Equal(now) || !again.Record.Superseded[b.KID].RetireAfter.Equal(now.Add(2*time.Hour)) {
		t.Errorf("a second forget changed the first's times: %+v", again.Record)
	}
}

// A forgotten host's last key may be retired (its value then goes); any
// other host's may not. Publishing under a forgotten name un-forgets it.
func TestForgottenRetireAndRepublish(t *testing.T) {
	a, b, _ := keys(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	gone := state([]Item{a}, nil, nil).Forget("forget-host", now, 0)
	next, err := gone.Retire([]string{a.KID}, now)
	if err != nil || len(next.Items) != 0 || next.Record.Retired[a.KID].IsZero() || next.Record.Forgotten.IsZero() {
		t.Fatalf("retire a forgotten host's last key: %v, value %v, record %+v", err, KIDs(next.Items), next.Record)
	}
	live := state([]Item{a, b}, map[string]Superseded{a.KID: {PEM: string(a.PEM)}, b.KID: {PEM: string(b.PEM)}}, nil)
	if _, err := live.Retire([]string{a.KID, b.KID}, now); err == nil {
		t.Fatal("a member's last key retired: its value would be empty")
	}
	back, _, err := next.Publish([]Item{b}, "publish-key", now, time.Hour)
	if err != nil || !back.Record.Forgotten.IsZero() || !slices.Equal(KIDs(back.Items), []string{b.KID}) {
		t.Fatalf("publish under a forgotten name: %v, forgotten %s, value %v", err, back.Record.Forgotten, KIDs(back.Items))
	}
}

// A restore that lost tombstones: KeepRetired writes them back with their
// original times, takes the keys out of the value and the superseded
// list, and keeps the tombstones the record has.
func TestKeepRetired(t *testing.T) {
	a, b, c := keys(t)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cur := state([]Item{a, b, c}, map[string]Superseded{a.KID: {RetireAfter: at, PEM: string(a.PEM)}}, map[string]time.Time{c.KID: at.Add(time.Hour)})
	next, added := cur.KeepRetired(map[string]time.Time{a.KID: at, c.KID: at})
	if !slices.Equal(added, []string{a.KID}) {
		t.Fatalf("added %v, want %s", added, a.KID)
	}
	if got := KIDs(next.Items); !slices.Equal(got, []string{b.KID}) {
		t.Errorf("value %v, want only %s", got, b.KID)
	}
	if _, ok := next.Record.Superseded[a.KID]; ok {
		t.Error("a retired key is still superseded")
	}
	if !next.Record.Retired[a.KID].Equal(at) || !next.Record.Retired[c.KID].Equal(at.Add(time.Hour)) {
		t.Errorf("tombstones %v, want a at %s and c's own time kept", next.Record.Retired, at)
	}
	if _, ok := cur.Record.Retired[a.KID]; ok {
		t.Error("KeepRetired changed its receiver's record")
	}
	// Every key retired: the value is empty, not refused.
	if next, _ := cur.KeepRetired(map[string]time.Time{a.KID: at, b.KID: at}); len(next.Items) != 0 {
		t.Errorf("value %v, want empty", KIDs(next.Items))
	}
}
