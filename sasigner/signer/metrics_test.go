package signer

import (
	"fmt"
	"testing"
)

// Every labelled counter's series exists at 0 before its first event: an
// alert on it can tell "never happened" from "not exported".
func TestMetricsSeriesAtZero(t *testing.T) {
	m := NewMetrics()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				got[fmt.Sprintf("%s{%s=%q}", mf.GetName(), l.GetName(), l.GetValue())] = s.GetCounter().GetValue() == 0
			}
		}
	}
	const ns = "kube_apiserver_sa_signer_"
	for _, want := range []string{
		ns + `sign_total{result="ok"}`, ns + `sign_total{result="invalid"}`, ns + `sign_total{result="error"}`,
		ns + `sign_total{result="unavailable"}`,
		ns + `etcd_restores_total{evidence="revision"}`, ns + `etcd_restores_total{evidence="cluster"}`,
		ns + `etcd_restores_total{evidence="compacted"}`,
		ns + `trust_record_errors_total{what="write"}`, ns + `trust_record_errors_total{what="controller_manager_key"}`,
		ns + `signing_key_file_warnings_total{reason="mode"}`, ns + `signing_key_file_warnings_total{reason="owner"}`,
	} {
		if !got[want] {
			t.Errorf("fresh registry lacks %s at 0", want)
		}
	}
}
