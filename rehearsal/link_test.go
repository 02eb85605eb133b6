//go:build rehearsal

package rehearsal

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// link is one host's network path to etcd: a TCP relay that can be cut
// (every connection closed, new ones refused) and restored, as a
// partition that heals. etcdtest.Proxy cuts for good.
type link struct {
	URL    string
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

func newLink(t *testing.T, targetURL string) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scheme, host, _ := strings.Cut(targetURL, "://")
	l := &link{URL: scheme + "://" + ln.Addr().String(), target: host, ln: ln, conns: map[net.Conn]struct{}{}}
	go l.accept()
	t.Cleanup(func() { _ = ln.Close(); l.Cut() })
	return l
}

func (l *link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for c := range l.conns {
		_ = c.Close()
	}
}

func (l *link) Restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = false
}

func (l *link) track(cs ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		return false
	}
	for _, c := range cs {
		l.conns[c] = struct{}{}
	}
	return true
}

func (l *link) accept() {
	for {
		in, err := l.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			out, err := net.Dial("tcp", l.target)
			if err != nil || !l.track(in, out) {
				_ = in.Close()
				if out != nil {
					_ = out.Close()
				}
				return
			}
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
				done <- struct{}{}
			}
			go pipe(out, in)
			go pipe(in, out)
			<-done
			<-done
			l.mu.Lock()
			delete(l.conns, in)
			delete(l.conns, out)
			l.mu.Unlock()
		}()
	}
}
