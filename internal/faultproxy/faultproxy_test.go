package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// echoServer answers each line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func newProxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// roundTrip sends a line on c and reads the echo within d.
func roundTrip(c net.Conn, d time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = c.SetDeadline(start.Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return time.Since(start), err
	}
	if line != "ping\n" {
		return 0, errors.New("bad echo " + line)
	}
	return time.Since(start), nil
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestModes(t *testing.T) {
	p := newProxy(t)
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
		t.Fatalf("address %s is not loopback", p.Addr())
	}
	c := dial(t, p)
	if _, err := roundTrip(c, time.Second); err != nil {
		t.Fatalf("pass: %v", err)
	}

	// Latency.
	p.SetLatency(50 * time.Millisecond)
	if err := p.SetMode(Latency); err != nil {
		t.Fatal(err)
	}
	if d, err := roundTrip(c, time.Second); err != nil || d < 50*time.Millisecond {
		t.Fatalf("latency: %v after %v, want ≥ 50ms", err, d)
	}

	// Stall: the open connection and a new one get no answer, but connect.
	if err := p.SetMode(Stall); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("stall, open connection: %v, want a timeout", err)
	}
	c2 := dial(t, p)
	if _, err := roundTrip(c2, 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("stall, new connection: %v, want a timeout", err)
	}
	if p.Discarded() < 2 {
		t.Fatalf("stall: %d chunks discarded, want ≥ 2", p.Discarded())
	}

	// Back to pass: the stalled connections are closed, new ones work.
	if err := p.SetMode(Pass); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, time.Second); err == nil {
		t.Fatal("a connection that stalled still works after the stall (it lost bytes)")
	}
	c3 := dial(t, p)
	if _, err := roundTrip(c3, time.Second); err != nil {
		t.Fatalf("pass after stall: %v", err)
	}

	// Reset: the open connection is reset, a new one is reset at once.
	if err := p.SetMode(Reset); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c3, time.Second); err == nil || isTimeout(err) {
		t.Fatalf("reset, open connection: %v, want a reset", err)
	}
	// A new connection is reset at once: on a loaded machine the reset can
	// arrive before the dial returns, which is the same outcome.
	if c4, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		defer c4.Close()
		if _, err := roundTrip(c4, time.Second); err == nil || isTimeout(err) {
			t.Fatalf("reset, new connection: %v, want a reset", err)
		}
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reset, new connection: dial: %v, want a reset", err)
	}

	// Refuse: connecting fails.
	if err := p.SetMode(Refuse); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("refuse: dial succeeded")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("refuse: %v, want connection refused", err)
	}

	// And back, on the same address.
	if err := p.SetMode(Pass); err != nil {
		t.Fatal(err)
	}
	c5 := dial(t, p)
	if _, err := roundTrip(c5, time.Second); err != nil {
		t.Fatalf("pass after refuse: %v", err)
	}
	if p.Accepted() < 5 || p.Forwarded() < 3 {
		t.Fatalf("counters: accepted %d, forwarded %d", p.Accepted(), p.Forwarded())
	}
}

// TestCloseLeavesNothing: Close resets every connection and ends every
// goroutine the proxy started, whatever the mode.
func TestCloseLeavesNothing(t *testing.T) {
	target := echoServer(t)
	before := runtime.NumGoroutine()
	for _, m := range []Mode{Pass, Latency, Stall, Reset, Refuse} {
		p, err := New(target)
		if err != nil {
			t.Fatal(err)
		}
		var conns []net.Conn
		for range 5 {
			c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			_, _ = roundTrip(c, time.Second)
		}
		if err := p.SetMode(m); err != nil {
			t.Fatal(err)
		}
		for _, c := range conns {
			_, _ = c.Write([]byte("x\n"))
		}
		_ = p.Close()
		if n := p.Active(); n != 0 {
			t.Errorf("%v: %d connections open after Close", m, n)
		}
		for _, c := range conns {
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := io.ReadAll(c); isTimeout(err) {
				t.Errorf("%v: a client connection is still open after Close", m)
			}
			c.Close()
		}
		if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
			t.Errorf("%v: still listening after Close", m)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("goroutines: %d before, %d after closing every proxy", before, n)
	}
}
