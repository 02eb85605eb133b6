package saferestart

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// status shows each host's rotation phase and any apiserver waiting for
// its key to be trusted (text and JSON), and exits 4 while a hold is
// active, 0 otherwise, so that a script can tell a stopped line by the code.
func TestStatusHoldAndRotations(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, rotationPrefix+"/m1/state", `{"host":"m1","phase":"installed","algorithm":"rsa-2048","previous":"K1","next":"K2","grace":"24h0m0s",`+
		`"started":"2030-01-01T00:00:00Z","updated":"2030-01-01T00:10:00Z","installed":"2030-01-01T00:10:00Z","retire_after":"2030-01-02T00:10:00Z"}`)
	s.Put(t, rotationPrefix+"/m2/waiting", `{"host":"m2","keys":["K9"],"since":"2030-01-01T00:00:00Z","pid":42}`)
	st := runBin(t, env(s), "status", "--lock-name", "rot")
	if st.code != codeOK {
		t.Fatalf("status without a hold: exit %d\n%s", st.code, st.stderr)
	}
	for _, want := range []string{"rotations: (" + rotationPrefix + ")", "m1: phase installed (next K2, previous K1",
		"m2: no rotation recorded; its apiserver WAITS for key K9 to be trusted"} {
		if !strings.Contains(st.stdout.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, st.stdout)
		}
	}
	if p := runBin(t, env(s), "hold", "--lock-name", "rot", "--reason", "maintenance"); p.code != codeOK {
		t.Fatalf("hold: exit %d\n%s", p.code, p.stderr)
	}
	st = runBin(t, env(s), "status", "--lock-name", "rot", "-o", "json")
	var rep struct {
		Hold      *struct{ Reason string } `json:"hold"`
		Rotations []struct {
			Host  string `json:"host"`
			State *struct {
				Phase string `json:"phase"`
			} `json:"state"`
			Waiting *struct {
				Keys []string `json:"keys"`
			} `json:"waiting"`
		} `json:"rotations"`
	}
	if st.code != codeHold {
		t.Fatalf("status under a hold: exit %d, want %d\n%s", st.code, codeHold, st.stderr)
	}
	if err := json.Unmarshal([]byte(st.stdout.String()), &rep); err != nil || rep.Hold == nil || len(rep.Rotations) != 2 ||
		rep.Rotations[0].State == nil || rep.Rotations[0].State.Phase != "installed" || rep.Rotations[1].Waiting == nil || rep.Rotations[1].Waiting.Keys[0] != "K9" {
		t.Fatalf("status json (%v):\n%s", err, st.stdout)
	}
	if p := runBin(t, env(s), "unhold", "--lock-name", "rot"); p.code != codeOK {
		t.Fatalf("unhold: exit %d\n%s", p.code, p.stderr)
	}
	if st = runBin(t, env(s), "status", "--lock-name", "rot", "--rotation-prefix", "/elsewhere"); st.code != codeOK || !strings.Contains(st.stdout.String(), "rotations: none (/elsewhere)") {
		t.Fatalf("status after unhold, other --rotation-prefix: exit %d\n%s", st.code, st.stdout)
	}
}
