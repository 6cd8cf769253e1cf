package sluice

import (
	"io"
	"net/http"
	"sync/atomic"
)

// Noticing a client that leaves while its request waits (a wait of
// the handler): every wait selects on watchClient(r).done() and ends with
// stop. net/http's HTTP/1.x server notices a hang-up only once the body is
// read to its end, so for an HTTP/1.x request with a body the watch reads
// up to readAheadMax of it ahead; the next handler still gets every byte,
// in order. HTTP/2 and HTTP/3 need nothing. docs/architecture.md ("A
// client that leaves") has the details.

// readAheadMax bounds the body a waiting request reads ahead (net/http's
// own bound on a body it reads after the handler): with max_waiting
// waiters, at most max_waiting times this much.
const readAheadMax = 256 << 10

// readAheadFirst is the first buffer of a body of unknown length (chunked);
// it doubles up to readAheadMax as the body comes.
const readAheadFirst = 16 << 10

// clientWatch watches a waiting request's client. The zero-cost case (no
// body, or not HTTP/1.x) keeps no reader.
type clientWatch struct {
	r *http.Request
	a *readAhead
}

// watchClient starts watching r's client for a wait of the handler. Nothing
// else may read r.Body until stop.
func watchClient(r *http.Request) clientWatch {
	if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return clientWatch{r: r}
	}
	n := int64(readAheadFirst)
	if r.ContentLength > 0 {
		// One byte more than the body, so the read that meets its end
		// (and lets net/http watch the connection) has room.
		n = min(r.ContentLength+1, readAheadMax)
	}
	a := &readAhead{src: r.Body, buf: make([]byte, 0, n), exited: make(chan struct{})}
	go a.run()
	return clientWatch{r: r, a: a}
}

// done is closed when the client goes away (or the server gives up on the
// request).
func (c clientWatch) done() <-chan struct{} { return c.r.Context().Done() }

// stop ends the watch and reports whether the client went away. It stops
// reading ahead, waiting for a read in flight (the client's next bytes,
// which the next handler would wait for as well), and leaves in r.Body a
// reader that gives the body read ahead, then the rest.
func (c clientWatch) stop() (gone bool) {
	if a := c.a; a != nil {
		a.halt.Store(true)
		<-a.exited
		c.r.Body = a
	}
	return c.r.Context().Err() != nil
}

// readAhead reads a body ahead while its request waits (run), then gives
// it to the next handler (Read): the bytes read ahead, then the rest.
type readAhead struct {
	src    io.ReadCloser
	buf    []byte // read ahead, not yet given
	err    error  // what ended the reading ahead: io.EOF, or the read's error
	halt   atomic.Bool
	exited chan struct{} // closed when run returns
}

// run reads the body into buf until its end, an error, readAheadMax bytes,
// or halt.
func (a *readAhead) run() {
	defer close(a.exited)
	for !a.halt.Load() {
		if len(a.buf) == cap(a.buf) {
			if cap(a.buf) >= readAheadMax {
				return // the rest waits for the next handler
			}
			grown := make([]byte, len(a.buf), min(2*cap(a.buf), readAheadMax))
			copy(grown, a.buf)
			a.buf = grown
		}
		n, err := a.src.Read(a.buf[len(a.buf):cap(a.buf)])
		a.buf = a.buf[:len(a.buf)+n]
		if err != nil {
			a.err = err
			return
		}
	}
}

// Read gives the body read ahead, then the rest of it (or the error that
// ended the reading ahead).
func (a *readAhead) Read(p []byte) (int, error) {
	if len(a.buf) > 0 {
		n := copy(p, a.buf)
		a.buf = a.buf[n:]
		if len(a.buf) == 0 {
			a.buf = nil
		}
		return n, nil
	}
	if a.err != nil {
		return 0, a.err
	}
	return a.src.Read(p)
}

// Close closes the body.
func (a *readAhead) Close() error { return a.src.Close() }
