package etcdtest

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestFreePortOutsideEphemeralRange: an outgoing connection or another
// process's :0 can never be handed a FreePort port.
func TestFreePortOutsideEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("no ephemeral range to check against: %v", err)
	}
	f := strings.Fields(string(b))
	lo, _ := strconv.Atoi(f[0])
	hi, _ := strconv.Atoi(f[1])
	for range 20 {
		if p := FreePort(t); p >= lo && p <= hi {
			t.Fatalf("FreePort = %d, inside the ephemeral range %d-%d", p, lo, hi)
		}
	}
}

// TestReservePortHeldUntilReleased: a reserved port is handed to no one
// else, even while nothing listens on it, until its test releases it.
func TestReservePortHeldUntilReleased(t *testing.T) {
	dir := t.TempDir()
	want := FreePort(t)
	p, release, err := reservePort(dir, want, want)
	if err != nil || p != want {
		t.Fatalf("first reservation = %d, %v; want %d", p, err, want)
	}
	if p2, _, err := reservePort(dir, want, want); err == nil {
		t.Fatalf("port %d handed out twice", p2)
	}
	release()
	if _, release, err := reservePort(dir, want, want); err != nil {
		t.Fatalf("after release: %v", err)
	} else {
		release()
	}
}

// TestReservePortSkipsListened: a port something listens on is not handed out.
func TestReservePortSkipsListened(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if p, _, err := reservePort(t.TempDir(), port, port); err == nil {
		t.Fatalf("port %d, which is listened on, was handed out", p)
	}
}
