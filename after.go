package sluice

import (
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The post-response hook: work an allowed request leaves for when its
// response is known, which never delays the response (data flow step 8 of
// the design). A zone that counts only some statuses (count.go) gives its
// charge back there; anything else that must happen once the response is
// settled, on any exit, belongs here too.
//
// A hook learns the response's status once, as soon as it is known:
//
//   - the first final WriteHeader (1xx are informational, but 101
//     Switching Protocols is final), or the first Write, ReadFrom or Flush
//     (an implicit 200), through the response writer ServeHTTP hands to
//     the next handlers; a streamed response is settled at its first
//     write, not at its end;
//   - else, once the next handlers return: an error's status (a
//     caddyhttp.HandlerError's, 500 for any other error), whatever the
//     site's handle_errors routes then write (basic_auth's 401 is a 401);
//     500 if they panicked (abort included); 200 if they wrote nothing.
//
// Then, once the next handlers have returned (on every exit: an error, a
// panic, the client gone, a stream's end), the hook is done.

// afterResponse is a post-response hook.
type afterResponse interface {
	// statusKnown is called once, with the response's status.
	statusKnown(status int)
	// done is called once, after statusKnown, when the next handlers have
	// returned; the hook may then be reused.
	done()
}

// serveAfter runs the next handlers with a response writer that reports
// the status to hook, and settles hook on any exit.
func (h *Handler) serveAfter(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, hook afterResponse) (err error) {
	sw := statusWriterPool.Get().(*statusWriter)
	sw.ResponseWriter, sw.hook, sw.known = w, hook, false
	returned := false
	defer func() {
		if !sw.known {
			status := http.StatusOK
			switch {
			case !returned: // a panic, passed on
				status = http.StatusInternalServerError
			case err != nil:
				status = errorStatus(err)
			}
			sw.known = true
			hook.statusKnown(status)
		}
		hook.done()
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
	hook  afterResponse
	known bool
}

var statusWriterPool = sync.Pool{New: func() any { return new(statusWriter) }}

func (w *statusWriter) settle(status int) {
	if !w.known {
		w.known = true
		w.hook.statusKnown(status)
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
