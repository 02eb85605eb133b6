package etcdtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// FreePort returns a loopback TCP port that nothing listened on a moment ago
// and that stays this test's until it ends, for servers the test stops and
// starts again on the same address (etcd, kube-apiserver, confd's metrics).
//
// A port from 127.0.0.1:0 is not safe for that: the kernel hands out the
// same ephemeral range to every outgoing connection and every other test
// process's :0, so while the server is down for a restart one of those can
// take its port, and the restarted server fails with "address already in
// use". FreePort's ports lie outside the ephemeral range, and each is held
// by an flock in a directory every test process on the machine shares, so
// no two tests (in any process) are handed the same port at once. The flock
// dies with its process, so a killed test leaves nothing reserved.
func FreePort(t testing.TB) int {
	t.Helper()
	from, to := candidatePorts()
	p, release, err := reservePort(portDir(), from, to)
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	t.Cleanup(release)
	return p
}

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ports[i] = FreePort(t)
	}
	return ports
}

// portDir holds one lock file per port handed out, shared by every test
// process of the same user.
func portDir() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("keysync-test-ports-%d", os.Getuid()))
}

// candidatePorts is the span of unprivileged ports outside the kernel's
// ephemeral range (net.ipv4.ip_local_port_range; Linux's default
// 32768–60999 when it cannot be read), the larger of the two sides.
func candidatePorts() (from, to int) {
	lo, hi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			l, err1 := strconv.Atoi(f[0])
			h, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && l <= h {
				lo, hi = l, h
			}
		}
	}
	if 65535-hi > lo-1024 {
		return hi + 1, 65535
	}
	return 1024, lo - 1
}

// reservePort takes the first port in from..to, from a random start, that
// no test holds and nothing listens on; release gives it back.
func reservePort(dir string, from, to int) (port int, release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, nil, fmt.Errorf("port lock directory: %w", err)
	}
	n := to - from + 1
	start := rand.IntN(n)
	for i := range n {
		p := from + (start+i)%n
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return 0, nil, fmt.Errorf("port lock file: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				continue
			}
			return 0, nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			f.Close()
			continue
		}
		ln.Close()
		return p, func() { f.Close() }, nil
	}
	return 0, nil, fmt.Errorf("every port in %d-%d is held by another test or in use", from, to)
}
