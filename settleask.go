package sluice

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/sluicehq/caddy-sluice/usage"
)

// Asking for usage (a settle json zone's ask_usage, on by default): an
// OpenAI-shaped streamed request, a POST of a JSON object with "stream":
// true to a path ending in /chat/completions or /completions, that does
// not set stream_options.include_usage to true is forwarded with it set,
// so its stream ends with a usage event the zone settles to. The client
// did not ask for that event (a chunk with "choices": [] that many
// clients index [0] of), so it is kept from the client's stream
// (usage.Strip), read by the zone all the same. A body over requestJSONMax,
// compressed, or whose top-level keys are escaped is forwarded as it
// came: its usage never arrives, and the zone's unknown rule charges it.

// readRequest reads an allowed request's JSON body (verdict, from
// startSettle) for the unknown rule's default: its output bound and its
// length; and, with ask, rewrites a streamed completion's to ask for usage
// and keeps the usage event from the client.
func readRequest(a *admission, st *settlement, ask bool) {
	r := a.r
	if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody || !isJSON(r.Header.Get("Content-Type")) ||
		r.Header.Get("Content-Encoding") != "" {
		return
	}
	size := int64(requestJSONMax)
	if r.ContentLength > size {
		st.bodyLen = r.ContentLength
		return // forwarded as it came
	}
	if r.ContentLength >= 0 {
		size = r.ContentLength
	}
	buf := make([]byte, size+1)
	n, err := io.ReadFull(r.Body, buf)
	buf = buf[:n]
	if err != io.EOF && err != io.ErrUnexpectedEOF {
		// Over the bound (a chunked body: at least what was read counts
		// for the unknown rule), or a read error the next handler sees
		// again.
		st.bodyLen = int64(n)
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
		return
	}
	st.bound, st.bodyLen = usage.OutputBound(buf), int64(n)
	body, ok := buf, false
	if ask && usage.CompletionsPath(r.URL.Path) {
		body, ok = usage.WithUsage(buf)
	}
	r.Body = readCloser{bytes.NewReader(body), r.Body}
	if !ok {
		return
	}
	r.ContentLength = int64(len(body))
	if r.Header.Get("Content-Length") != "" {
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	s := stripPool.Get().(*usage.Strip)
	s.Reset()
	a.settle.strip, a.rewrite = s, s
}

// stripPool pools the usage.Strip of the requests rewritten.
var stripPool = sync.Pool{New: func() any { return new(usage.Strip) }}
