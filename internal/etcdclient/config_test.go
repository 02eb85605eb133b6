package etcdclient

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// fakeResolver answers SRV queries from a map keyed by the full record name.
type fakeResolver struct {
	records map[string][]*net.SRV
	asked   []string
}

func (f *fakeResolver) LookupSRV(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
	full := name
	if service != "" || proto != "" {
		full = "_" + service + "._" + proto + "." + name
	}
	f.asked = append(f.asked, full)
	if recs, ok := f.records[full]; ok {
		return full, recs, nil
	}
	return "", nil, &net.DNSError{Err: "no such host", Name: full, IsNotFound: true}
}

func TestEndpoints(t *testing.T) {
	srv := func(target string, port uint16) *net.SRV { return &net.SRV{Target: target, Port: port} }
	records := map[string][]*net.SRV{
		"_etcd-client._tcp.example.com":    {srv("m1.example.com.", 2379), srv("m2.example.com.", 2379)},
		"_etcdv3._tcp.confd.example":       {srv("c1.confd.example.", 4001)},
		"_etcd._tcp.confd.example":         {srv("v2.confd.example.", 4002)},
		"_etcdv3._tcp.both.example":        {srv("confd-style.both.example.", 1)},
		"_etcd-client._tcp.both.example":   {srv("etcd-style.both.example.", 2)},
		"_etcd-client._tcp.ipv6.example":   {srv("::1", 2379)},
		"_custom._tcp.records.example.com": {srv("r1.example.com.", 12379)},
	}
	for _, tc := range []struct {
		name  string
		cfg   Config
		want  []string
		asked []string // SRV names looked up, in order
	}{
		{name: "default node", want: []string{"http://127.0.0.1:2379"}},
		{name: "default node with TLS", cfg: Config{ClientCAKeys: "ca.pem"}, want: []string{"https://127.0.0.1:2379"}},
		{name: "host:port gets http", cfg: Config{Nodes: []string{"10.0.0.1:2379", " 10.0.0.2:2379 ", ""}},
			want: []string{"http://10.0.0.1:2379", "http://10.0.0.2:2379"}},
		{name: "host:port gets https with client cert", cfg: Config{Nodes: []string{"m1:2379"}, ClientCert: "c", ClientKey: "k"},
			want: []string{"https://m1:2379"}},
		{name: "host:port gets https with insecure", cfg: Config{Nodes: []string{"m1:2379"}, ClientInsecure: true},
			want: []string{"https://m1:2379"}},
		{name: "confd default scheme http does not undo TLS", cfg: Config{Nodes: []string{"m1:2379"}, Scheme: "http", ClientCAKeys: "ca"},
			want: []string{"https://m1:2379"}},
		{name: "scheme https", cfg: Config{Nodes: []string{"m1:2379"}, Scheme: "https"}, want: []string{"https://m1:2379"}},
		{name: "URL kept", cfg: Config{Nodes: []string{"https://m1:2379/", "https://[::1]:2379"}},
			want: []string{"https://m1:2379", "https://[::1]:2379"}},
		{name: "nodes win over SRV", cfg: Config{Nodes: []string{"m9:1"}, SRVDomain: "example.com"},
			want: []string{"http://m9:1"}},
		{name: "SRV record", cfg: Config{SRVRecord: "_custom._tcp.records.example.com"},
			want: []string{"http://r1.example.com:12379"}, asked: []string{"_custom._tcp.records.example.com"}},
		{name: "SRV record with TLS", cfg: Config{SRVRecord: "_custom._tcp.records.example.com", ClientCAKeys: "ca"},
			want: []string{"https://r1.example.com:12379"}},
		{name: "SRV domain, confd's name first", cfg: Config{SRVDomain: "confd.example"},
			want: []string{"http://c1.confd.example:4001"}, asked: []string{"_etcdv3._tcp.confd.example"}},
		{name: "SRV domain, backend etcd", cfg: Config{Backend: "etcd", SRVDomain: "confd.example"},
			want: []string{"http://v2.confd.example:4002"}, asked: []string{"_etcd._tcp.confd.example"}},
		{name: "SRV domain, etcd's name second", cfg: Config{SRVDomain: "example.com", Scheme: "https"},
			want:  []string{"https://m1.example.com:2379", "https://m2.example.com:2379"},
			asked: []string{"_etcdv3._tcp.example.com", "_etcd-client._tcp.example.com"}},
		{name: "SRV domain, both exist", cfg: Config{SRVDomain: "both.example"},
			want: []string{"http://confd-style.both.example:1"}},
		{name: "SRV IPv6 target", cfg: Config{SRVDomain: "ipv6.example"}, want: []string{"http://[::1]:2379"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &fakeResolver{records: records}
			tc.cfg.Resolver = r
			got, err := endpoints(context.Background(), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("endpoints = %q, want %q", got, tc.want)
			}
			if tc.asked != nil && !slices.Equal(r.asked, tc.asked) {
				t.Errorf("looked up %q, want %q", r.asked, tc.asked)
			}
		})
	}
}

func TestEndpointsErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"SRV not found", Config{SRVDomain: "nowhere.example"},
			[]string{"_etcdv3._tcp.nowhere.example", "_etcd-client._tcp.nowhere.example"}},
		{"SRV record not found", Config{SRVRecord: "_x._tcp.nowhere.example"}, []string{"_x._tcp.nowhere.example"}},
		{"bad scheme flag", Config{Scheme: "ftp"}, []string{`"ftp"`}},
		{"bad node scheme", Config{Nodes: []string{"unix:///run/etcd.sock"}}, []string{"unix:///run/etcd.sock"}},
		{"no port", Config{Nodes: []string{"http://m1"}}, []string{"http://m1", "port"}},
		{"path", Config{Nodes: []string{"http://m1:2379/v2"}}, []string{"http://m1:2379/v2"}},
		{"mixed schemes", Config{Nodes: []string{"http://m1:1", "https://m2:1"}}, []string{"mix"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Resolver = &fakeResolver{}
			got, err := endpoints(context.Background(), tc.cfg)
			if err == nil {
				t.Fatalf("no error, endpoints %q", got)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}

func TestTLSConfig(t *testing.T) {
	files := etcdtest.WriteTLSFiles(t, t.TempDir())
	notPEM := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plain := []string{"http://127.0.0.1:2379"}
	if tc, err := tlsConfig(Config{}, plain); err != nil || tc != nil {
		t.Errorf("plain http: tls config %v, err %v; want none", tc, err)
	}
	tc, err := tlsConfig(Config{}, []string{"https://127.0.0.1:2379"})
	if err != nil || tc == nil || tc.RootCAs != nil {
		t.Errorf("https without files: %v, %v; want system roots", tc, err)
	}
	tc, err = tlsConfig(Config{ClientCAKeys: files.CA, ClientCert: files.ClientCert, ClientKey: files.ClientKey}, plain)
	if err != nil || tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.InsecureSkipVerify {
		t.Errorf("full TLS: %+v, %v", tc, err)
	}
	if tc, err := tlsConfig(Config{ClientInsecure: true}, plain); err != nil || !tc.InsecureSkipVerify {
		t.Errorf("insecure: %+v, %v", tc, err)
	}
	for _, bad := range []struct {
		cfg  Config
		want string
	}{
		{Config{ClientCAKeys: filepath.Join(t.TempDir(), "missing.pem")}, "missing.pem"},
		{Config{ClientCAKeys: notPEM}, "empty.pem"},
		{Config{ClientCert: files.ClientCert}, "without its key"},
		{Config{ClientKey: files.ClientKey}, "without its certificate"},
		{Config{ClientCert: files.ClientCert, ClientKey: files.UntrustedClientKey}, files.ClientCert},
	} {
		if _, err := tlsConfig(bad.cfg, plain); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("tlsConfig(%+v) err = %v, want mention of %q", bad.cfg, err, bad.want)
		}
	}
}
