package etcdtest

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// Proxy is a loopback TCP proxy in front of a server, for cutting a client
// off: Cut closes every proxied connection and refuses new ones, as a
// network partition between one client and etcd would.
type Proxy struct {
	t      testing.TB
	target string // guarded by mu
	scheme string
	addr   string

	ln net.Listener // guarded by mu once running

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	cut   bool
	wg    sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards each connection to
// target ("host:port" or a URL such as Server.Endpoint). It is cut when the
// test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p := &Proxy{t: t, target: target, conns: map[net.Conn]struct{}{}}
	if strings.Contains(target, "://") {
		u, err := url.Parse(target)
		if err != nil {
			t.Fatalf("proxy target %q: %v", target, err)
		}
		p.target, p.scheme = u.Host, u.Scheme
	}
	// A reserved port, not :0: Restore listens on the same address again.
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", FreePort(t)))
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p.ln, p.addr = ln, ln.Addr().String()
	p.wg.Add(1)
	go p.accept(ln)
	t.Cleanup(func() { p.Cut(); p.wg.Wait() })
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr }

// Endpoint is the proxy's address with the target's URL scheme (http when
// the target was given as host:port).
func (p *Proxy) Endpoint() string {
	s := p.scheme
	if s == "" {
		s = "http"
	}
	return s + "://" + p.Addr()
}

// Cut closes all proxied connections and the listener: from now on
// connecting to Addr is refused. Safe to call more than once.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	p.cut = true
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
}

// track registers c unless the proxy is cut.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// Retarget sends the connections made from now on to target (as in
// NewProxy): Cut, Retarget and Restore put another etcd behind the same
// address, as a DNS name or load balancer moved to a new cluster does.
func (p *Proxy) Retarget(target string) {
	if u, err := url.Parse(target); err == nil && u.Host != "" {
		target = u.Host
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Restore ends a Cut: the proxy listens on the same address again, as a
// healed partition. It fails the test if the port was taken meanwhile.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Errorf("proxy restore on %s: %v", p.addr, err)
		return
	}
	p.ln, p.cut = ln, false
	p.wg.Add(1)
	go p.accept(ln)
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(in)
	}
}

func (p *Proxy) serve(in net.Conn) {
	defer p.wg.Done()
	if !p.track(in) {
		_ = in.Close()
		return
	}
	defer p.untrack(in)
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	out, err := net.Dial("tcp", target)
	if err != nil {
		_ = in.Close()
		return
	}
	if !p.track(out) {
		_ = in.Close()
		_ = out.Close()
		return
	}
	defer p.untrack(out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// One direction ended: end both, so neither side hangs half-open.
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}
