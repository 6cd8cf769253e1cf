package sluice

import (
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The post-response step (data flow step 8 of the design): what an allowed
// request leaves for when its response is known and the next handlers
// have returned, whatever way they return. One pooled value per request
// (after) carries every part, and a request with nothing to do has none
// (nil) and pays nothing:
//
//   - settle: a zone that counts only some statuses (count.go) gives its
//     charge back when the response's status does not count;
//   - slots: a concurrency zone (concurrency.go) gives its slot back, on
//     every exit.
//
// A request that waits for its turn (delay.go) and whose client leaves
// first never reaches the next handlers: its waiter gives every rate
// charge back, its reservation included, and the step then only releases
// its slots (no status is ever known: nothing is refunded twice).
//
// The status is learnt once, as soon as it is known, and only by a request
// with a count zone (the others' response writer is not wrapped):
//
//   - the first final WriteHeader (1xx are informational, but 101
//     Switching Protocols is final), or the first Write, ReadFrom or Flush
//     (an implicit 200), through the response writer ServeHTTP hands to
//     the next handlers; a streamed response is settled at its first
//     write, not at its end;
//   - else, once the next handlers return: an error's status (a
//     caddyhttp.HandlerError's, 500 for any other error), whatever the
//     site's handle_errors routes then write (basic_auth's 401 is a 401);
//     500 if they panicked (abort included); 200 if they wrote nothing;
//   - unknown (counted by every zone: the charge stays) if the client left
//     before it was known, or when it is the 499 Caddy writes for a
//     client gone; counted by no zone when a later rate_limit handler
//     refuses the request, or its client leaves while that handler holds
//     it (markRefusal).
//
// Then, once the next handlers have returned (on every exit: an error, a
// panic, the client gone, a stream's end), ServeHTTP's deferred done
// releases the slots and recycles the value. Nothing here holds the
// response up: the stores give back and release without waiting on the
// network (a remote store queues the call).

// after is an allowed request's post-response step. Pooled.
type after struct {
	h *Handler
	// settle: the count zones' charges to give back unless the status
	// counts (count.go); empty for none.
	settle settlement
	// slots: the concurrency slots the request holds (concurrency.go);
	// empty for none.
	slots heldSlots
}

var afterPool = sync.Pool{New: func() any { return new(after) }}

// afterOf returns the post-response step of the allowed request decided
// in s (s.store decided it), or nil when it leaves nothing to do.
func (h *Handler) afterOf(s *scratch) *after {
	var a *after
	if h.counting {
		a = h.settleCounts(s, a)
	}
	if h.concurrent {
		a = h.holdSlots(s, a)
	}
	return a
}

// newAfter returns an empty post-response step from the pool.
func (h *Handler) newAfter() *after {
	a := afterPool.Get().(*after)
	a.h = h
	return a
}

// wantsStatus reports whether a's work depends on the response's status
// (a count zone to settle): the next handlers then get a response writer
// that reports it (serveAfter). False for nil.
func (a *after) wantsStatus() bool { return a != nil && len(a.settle.refunds) > 0 }

// statusKnown is called once, with the response's status.
func (a *after) statusKnown(status int) {
	a.settle.statusKnown(status)
	a.h.settled.notify()
}

// done is called once, on every exit of an allowed request, after its
// status (if it wanted one) is known: it gives the concurrency slots back
// and recycles a.
func (a *after) done() {
	a.h.releaseSlots(&a.slots)
	a.settle.reset()
	a.h = nil
	afterPool.Put(a)
}

// serveAfter runs the next handlers with a response writer that reports
// the status to a, and settles the status on any exit (ServeHTTP then runs
// a.done).
func (h *Handler) serveAfter(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, a *after) (err error) {
	sw := statusWriterPool.Get().(*statusWriter)
	sw.ResponseWriter, sw.hook, sw.known, sw.refused = w, a, false, false
	returned := false
	defer func() {
		if !sw.known {
			status := http.StatusOK
			switch {
			case r.Context().Err() != nil:
				// The client left (or the server gave up on it) before
				// the status was known: whatever the next handlers made
				// of that (reverse_proxy: 499), the request was forwarded.
				status = statusUnknown
			case !returned: // a panic, passed on
				status = http.StatusInternalServerError
			case err != nil:
				status = errorStatus(err)
			}
			sw.settle(status)
		}
		sw.ResponseWriter, sw.hook = nil, nil
		statusWriterPool.Put(sw)
	}()
	err = next.ServeHTTP(sw, r)
	returned = true
	return err
}

// errorStatus is the status Caddy answers an error from a handler with.
func errorStatus(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return http.StatusInternalServerError
}

// statusWriter tells its hook the response's status at the first final
// WriteHeader or the first write.
type statusWriter struct {
	caddyhttp.ResponseWriterWrapper
	hook  *after
	known bool
	// refused: a later rate_limit handler refuses the request (markRefusal):
	// its response is counted by no zone.
	refused bool
}

var statusWriterPool = sync.Pool{New: func() any { return new(statusWriter) }}

func (w *statusWriter) settle(status int) {
	if !w.known {
		w.known = true
		switch {
		case w.refused:
			status = statusRefusal
		case status == statusClientClosed:
			// Written for a client that left (reverse_proxy does):
			// the status is unknown.
			status = statusUnknown
		}
		w.hook.statusKnown(status)
	}
}

// markRefusal tells the count zones of earlier rate_limit handlers, whose
// status writers w wraps, that the response is a refusal of this one's.
func markRefusal(w http.ResponseWriter) {
	for {
		if sw, ok := w.(*statusWriter); ok {
			sw.refused = true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// WriteHeader reports a final status (every status but 1xx; 101 is final).
func (w *statusWriter) WriteHeader(status int) {
	if status >= 200 || status == http.StatusSwitchingProtocols {
		w.settle(status)
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write reports an implicit 200 when nothing was written before.
func (w *statusWriter) Write(b []byte) (int, error) {
	w.settle(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

// ReadFrom reports an implicit 200, as Write.
func (w *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	w.settle(http.StatusOK)
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError reports an implicit 200 (a flush sends the header), then
// flushes (http.ResponseController).
func (w *statusWriter) FlushError() error {
	w.settle(http.StatusOK)
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush implements http.Flusher for handlers that assert it.
func (w *statusWriter) Flush() { _ = w.FlushError() }

// Interface guards.
var (
	_ http.Flusher  = (*statusWriter)(nil)
	_ io.ReaderFrom = (*statusWriter)(nil)
)
