package template

import (
	"fmt"
	"net"
	"testing"
)

// Only IP literals and an invalid name: they resolve without any network.
func TestLookupFuncs(t *testing.T) {
	runFuncCases(t, nil, []funcCase{
		{name: "lookupIP v4 literal", tmpl: `{{lookupIP "127.0.0.1"}}`, want: "[127.0.0.1]"},
		{name: "lookupIP v6 literal", tmpl: `{{lookupIP "::1"}}`, want: "[::1]"},
		{name: "lookupIPV4", tmpl: `{{lookupIPV4 "127.0.0.1"}} {{lookupIPV4 "::1"}}`, want: "[127.0.0.1] []"},
		{name: "lookupIPV6", tmpl: `{{lookupIPV6 "::1"}} {{lookupIPV6 "127.0.0.1"}}`, want: "[::1] []"},
		{name: "lookupIPV6 range none", tmpl: `{{range lookupIPV6 "127.0.0.1"}}server {{.}};{{end}}`, want: ""},
		{name: "lookupIP error is empty", tmpl: `{{lookupIP "invalid..name"}}`, want: "[]"},
		{name: "lookupSRV error is empty", tmpl: `{{lookupSRV "x" "tcp" "invalid..name"}}|{{range lookupSRV "x" "tcp" "invalid..name"}}x{{end}}`, want: "[]|"},
	})
}

func TestSortSRV(t *testing.T) {
	addrs := []*net.SRV{
		{Target: "b.", Port: 80, Priority: 1, Weight: 1},
		{Target: "a.", Port: 80, Priority: 9, Weight: 1},
		{Target: "a.", Port: 8080, Priority: 1, Weight: 1},
		{Target: "a.", Port: 80, Priority: 1, Weight: 10},
	}
	sortSRV(addrs)
	var got []string
	for _, a := range addrs {
		got = append(got, fmt.Sprintf("%s:%d/%d/%d", a.Target, a.Port, a.Priority, a.Weight))
	}
	// By text "a.80110" < "a.808011" < "a.8091" < "b.8011": port 8080 lands
	// between two port-80 records.
	want := []string{"a.:80/1/10", "a.:8080/1/1", "a.:80/9/1", "b.:80/1/1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
