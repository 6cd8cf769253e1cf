package sluice

import (
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// errorStatus is the status Caddy answers an error from a handler with.
func errorStatus(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return http.StatusInternalServerError
}

// bodyRewrite is a control's rewrite of the response's body on its way to
// the client (settle's ask: usage.Strip, which keeps the usage event the
// client did not ask for from it): Header sees the status and header,
// Filters says the body goes through Write, Flush sends what Write held.
type bodyRewrite interface {
	Header(h http.Header, status int)
	Filters() bool
	Write(w io.Writer, p []byte) error
	Flush(w io.Writer) error
}

// statusWriter tells its admission the response's status, once: at the
// first final WriteHeader (101 is final), or the first Write, ReadFrom or
// Flush (an implicit 200); else admission.forward notes it when the next
// handlers return. docs/architecture.md lists every case.
type statusWriter struct {
	caddyhttp.ResponseWriterWrapper
	hook  *admission
	known bool
	// refused: a later rate_limit handler refuses the request (markRefusal):
	// its response is counted by no zone.
	refused bool
	// body: each piece of the body written is handed to the admission,
	// once the client's writer has it (admission.bodyWritten).
	body bool
}

var statusWriterPool = sync.Pool{New: func() any { return new(statusWriter) }}

// noteStatus tells the admission the response's status, the first time.
func (w *statusWriter) noteStatus(status int) {
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
		w.noteStatus(status)
		if s := w.hook.rewrite; s != nil {
			s.Header(w.Header(), status)
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write reports an implicit 200 when nothing was written before.
func (w *statusWriter) Write(b []byte) (int, error) {
	w.noteStatus(http.StatusOK)
	if s := w.hook.rewrite; s != nil {
		if s.Header(w.Header(), http.StatusOK); s.Filters() {
			// The zone reads every byte; the client gets them less the
			// usage event it did not ask for (settleask.go).
			err := s.Write(w.ResponseWriter, b)
			if w.body {
				w.hook.bodyWritten(b)
			}
			if err != nil {
				return 0, err
			}
			return len(b), nil
		}
	}
	n, err := w.ResponseWriter.Write(b)
	if w.body && n > 0 {
		w.hook.bodyWritten(b[:n])
	}
	return n, err
}

// ReadFrom reports an implicit 200, as Write.
func (w *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	w.noteStatus(http.StatusOK)
	if w.body {
		return io.Copy(writerOnly{w}, r) // through Write, which reads the body
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// writerOnly hides a writer's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// FlushError reports an implicit 200 (a flush sends the header), then
// flushes (http.ResponseController).
func (w *statusWriter) FlushError() error {
	w.noteStatus(http.StatusOK)
	if s := w.hook.rewrite; s != nil {
		s.Header(w.Header(), http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush implements http.Flusher for handlers that assert it.
func (w *statusWriter) Flush() { _ = w.FlushError() }

// Interface guards.
var (
	_ http.Flusher  = (*statusWriter)(nil)
	_ io.ReaderFrom = (*statusWriter)(nil)
)
