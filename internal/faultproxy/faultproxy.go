// Package faultproxy is a TCP proxy for tests that breaks the connection to
// a server on demand: it listens on 127.0.0.1 (a random port) and forwards
// to a target, passing bytes through, adding latency, stalling (accepting
// and reading, never answering), resetting connections or refusing them,
// switchable at run time. Close ends everything it started.
package faultproxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what the proxy does to traffic.
type Mode int32

// Modes.
const (
	// Pass forwards both ways.
	Pass Mode = iota
	// Latency forwards both ways, each chunk from the client delayed by
	// the latency (SetLatency).
	Latency
	// Stall accepts connections and reads what clients send but forwards
	// nothing either way: the server seems alive and never answers.
	// Connections open when it starts stall too.
	Stall
	// Reset accepts and resets (RST) every connection at once, and resets
	// the ones open when it starts.
	Reset
	// Refuse closes the listener (connecting is refused by the kernel) and
	// resets the open connections; leaving it listens again on the same
	// port.
	Refuse
)

var modeNames = [...]string{"pass", "latency", "stall", "reset", "refuse"}

func (m Mode) String() string { return modeNames[m] }

// Proxy is a fault-injecting TCP proxy.
type Proxy struct {
	target string
	addr   string

	mode    atomic.Int32
	latency atomic.Int64

	accepted  atomic.Int64 // connections accepted
	forwarded atomic.Int64 // chunks forwarded client → target
	discarded atomic.Int64 // chunks read from clients and dropped (stall)

	mu     sync.Mutex
	ln     net.Listener
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

type link struct {
	client   net.Conn
	server   atomic.Pointer[net.Conn]
	isClosed atomic.Bool
	stalled  atomic.Bool // it lost bytes: close it when the stall ends
	once     sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		l.isClosed.Store(true)
		rst(l.client)
		if s := l.server.Load(); s != nil {
			_ = (*s).Close()
		}
	})
}

// rst closes c with a TCP reset rather than a FIN.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// New starts a proxy to target (host:port) in Pass mode.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.serve(ln)
	return p, nil
}

// Addr is the proxy's address (127.0.0.1:port).
func (p *Proxy) Addr() string { return p.addr }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode { return Mode(p.mode.Load()) }

// SetLatency sets the delay of Latency mode.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// Accepted is the number of connections accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Forwarded is the number of chunks forwarded from clients to the target.
func (p *Proxy) Forwarded() int64 { return p.forwarded.Load() }

// Discarded is the number of chunks read from clients and dropped by Stall.
func (p *Proxy) Discarded() int64 { return p.discarded.Load() }

// Active is the number of connections open through the proxy.
func (p *Proxy) Active() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// SetMode switches the mode. Entering Reset or Refuse resets the open
// connections; leaving Stall closes the connections that stalled (they lost
// bytes); leaving Refuse listens again on the same address.
func (p *Proxy) SetMode(m Mode) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultproxy: closed")
	}
	old := Mode(p.mode.Swap(int32(m)))
	switch m {
	case Reset, Refuse:
		for l := range p.links {
			l.close()
		}
	case Stall:
		for l := range p.links {
			l.stalled.Store(true)
		}
	}
	if old == Stall && m != Stall {
		for l := range p.links {
			if l.stalled.Load() {
				l.close()
			}
		}
	}
	if m == Refuse && p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	if m != Refuse && p.ln == nil {
		var ln net.Listener
		var err error
		for range 50 { // the port was just ours; retry briefly if TIME_WAIT lingers
			if ln, err = net.Listen("tcp", p.addr); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			return err
		}
		p.ln = ln
		p.wg.Add(1)
		go p.serve(ln)
	}
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		p.accepted.Add(1)
		switch Mode(p.mode.Load()) {
		case Reset, Refuse:
			rst(c)
			continue
		}
		l := &link{client: c}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			rst(c)
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(l)
	}
}

func (p *Proxy) handle(l *link) {
	defer p.wg.Done()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	if Mode(p.mode.Load()) == Stall {
		l.stalled.Store(true)
	}
	if !l.stalled.Load() {
		s, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			return
		}
		l.server.Store(&s)
		if l.isClosed.Load() { // closed while dialing: close() may have missed s
			_ = s.Close()
			return
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.pipe(l, l.client, s, false)
			l.close()
		}()
		p.pipe(l, s, l.client, true)
		l.close()
		<-done
		return
	}
	// Stalled from the start: read and drop until the client gives up.
	p.pipe(l, nil, l.client, true)
}

// pipe copies src to dst; up is client → target. While the link is stalled
// it reads and drops.
func (p *Proxy) pipe(l *link, dst, src net.Conn, up bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			switch {
			case l.stalled.Load():
				if up {
					p.discarded.Add(1)
				}
			default:
				if up {
					if Mode(p.mode.Load()) == Latency {
						time.Sleep(time.Duration(p.latency.Load()))
					}
					p.forwarded.Add(1)
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// Close stops listening, resets every connection and waits for every
// goroutine it started.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for l := range p.links {
		l.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}
