//go:build rehearsal

package rehearsal

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// supersededKey is a key a scenario left published as superseded, with a
// token signed with it, for a later scenario to retire.
type supersededKey struct {
	host  *host
	kid   string
	token string
}

// keptRecord is a host's key record (…-rotation/HOST/kept).
type keptRecord struct {
	Superseded map[string]struct {
		RetireAfter time.Time `json:"retire_after"`
	} `json:"superseded"`
	Retired map[string]string `json:"retired"`
}

func (f *fleet) keptRecord(t *testing.T, h *host) keptRecord {
	t.Helper()
	key := "/kubernetes/service-account-keys-rotation/" + h.name + "/kept"
	var rec keptRecord
	if err := json.Unmarshal([]byte(f.etcdKeys(t, key)[key]), &rec); err != nil {
		t.Fatalf("%s's key record %s: %v", h.name, key, err)
	}
	return rec
}

// retireTimers: the key reimaged left superseded is due; every master's
// shipped sa-key-retire.service (what sa-key-retire.timer starts, hourly
// on each of them) starts at the same moment. Every run exits 0, the key
// is retired by exactly one of them (one "retired" line, one tombstone, the
// host's value its current key alone, the other hosts' values untouched),
// every master renders and restarts once, a token signed with the retired
// key is then refused everywhere, and tokens of the current keys are
// accepted 9 of 9 throughout.
func (f *fleet) retireTimers(t *testing.T) {
	sk := f.superseded
	if sk == nil {
		t.Skip("no superseded key to retire: run reimaged first")
	}
	f.superseded = nil
	rec := f.keptRecord(t, sk.host)
	due, ok := rec.Superseded[sk.kid]
	if !ok {
		t.Fatalf("%s's key record does not list %s as superseded: %+v", sk.host.name, sk.kid, rec)
	}
	time.Sleep(time.Until(due.RetireAfter) + 100*time.Millisecond) // the grace period is wall-clock time
	probe := f.startTokenProbe(t)
	defer probe.finish(t)

	values := f.etcdKeys(t, keyPrefix)
	before := f.restarts()
	updated := map[string]int{}
	for _, h := range f.hosts {
		updated[h.name] = h.confd.out.count("Target config", "sa-bundle.pem", "has been updated")
	}
	// The unit's command lines, read here: a goroutine must not fail the test.
	units := make([]*oneshot, len(f.hosts))
	for i, h := range f.hosts {
		units[i] = h.oneshot(t, "sa-key-retire.service")
	}
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	codes, outs := make([]int, len(units)), make([]string, len(units))
	for i := range units {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			codes[i], outs[i] = units[i].run()
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()

	retiredBy := 0
	for i, h := range f.hosts {
		out := outs[i]
		if codes[i] != 0 {
			t.Errorf("sa-key-retire.service on %s exited %d:\n%s", h.name, codes[i], out)
		}
		n := strings.Count(out, "key "+sk.kid+" retired")
		retiredBy += n
		t.Logf("sa-key-retire.service on %s: exit %d, retired %s %d times", h.name, codes[i], sk.kid, n)
	}
	if retiredBy != 1 {
		t.Errorf("%s retired %d times by the three runs, want once", sk.kid, retiredBy)
	}
	rec = f.keptRecord(t, sk.host)
	if _, ok := rec.Superseded[sk.kid]; ok {
		t.Errorf("%s still superseded (not retired) in %s's key record", sk.kid, sk.host.name)
	}
	if rec.Retired[sk.kid] == "" {
		t.Errorf("%s's key record has no tombstone for %s: %+v", sk.host.name, sk.kid, rec.Retired)
	}
	after := f.etcdKeys(t, keyPrefix)
	for _, h := range f.hosts {
		got := valueKids([]byte(after[keyPrefix+h.name]))
		switch {
		case h == sk.host && !slices.Equal(got, []string{h.sa.kid}):
			t.Errorf("%s's value holds %v, want its current key %s alone", h.name, got, h.sa.kid)
		case h != sk.host && after[keyPrefix+h.name] != values[keyPrefix+h.name]:
			t.Errorf("%s's value changed: %v, was %v", h.name, got, valueKids([]byte(values[keyPrefix+h.name])))
		}
	}

	f.awaitConverged(t, 4*time.Minute) // every bundle and JWKS without the retired key
	for i, h := range f.hosts {
		n := h.confd.out.count("Target config", "sa-bundle.pem", "has been updated") - updated[h.name]
		if r := f.restarts()[i] - before[i]; r != 1 || n != 1 {
			t.Errorf("%s: %d bundle renders and %d restarts, want one of each", h.name, n, r)
		}
	}
	anon := httpClient(t, f.ca.pem, nil, nil)
	refused := 0
	for _, h := range f.hosts {
		if code, err := tryReview(anon, h, sk.token); err != nil || code != http.StatusUnauthorized {
			t.Errorf("%s: the token of %s's retired key: %d %v, want refused (401)", h.name, sk.host.name, code, err)
		} else {
			refused++
		}
	}
	t.Logf("the token signed with the retired key %s: refused by %d of %d apiservers", sk.kid, refused, len(f.hosts))
	f.assertAllTokensAccepted(t)
}
