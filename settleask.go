package sluice

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// Asking for usage (a settle json zone's ask_usage, on by default): an
// OpenAI-shaped streamed request, a POST of a JSON object with "stream":
// true to a path ending in /chat/completions or /completions, that does
// not set stream_options.include_usage to true is forwarded with it set,
// so its stream ends with a usage event the zone settles to. The client
// did not ask for that event (a chunk with "choices": [] that many
// clients index [0] of), so it is kept from the client's stream
// (usageStrip), read by the zone all the same. A body over requestJSONMax,
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
	st.bound, st.bodyLen = outputBound(buf), int64(n)
	body, ok := buf, false
	if ask && completionsPath(r.URL.Path) {
		body, ok = withUsage(buf)
	}
	r.Body = readCloser{bytes.NewReader(body), r.Body}
	if !ok {
		return
	}
	r.ContentLength = int64(len(body))
	if r.Header.Get("Content-Length") != "" {
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	a.strip = stripPool.Get().(*usageStrip)
	a.strip.reset()
}

// outputBound returns the largest of the request's output bounds
// (max_completion_tokens, max_tokens, max_output_tokens: chat completions,
// completions and Anthropic's, the Responses API), 0 for none.
func outputBound(body []byte) int64 {
	var most int64
	members(body, func(m member) bool {
		switch string(m.key) {
		case "max_completion_tokens", "max_tokens", "max_output_tokens":
			if n, ok := parseCount(body[m.start:m.end]); ok {
				most = max(most, n)
			}
		}
		return true
	})
	return min(most, maxSettled)
}

// completionsPath reports whether an API path is OpenAI's chat completions
// or completions (/v1/chat/completions, /openai/deployments/x/completions).
func completionsPath(p string) bool {
	return strings.HasSuffix(p, "/chat/completions") || strings.HasSuffix(p, "/completions")
}

// withUsage returns body asking for usage, and true, when body is a
// streamed request that does not ask for it; else body as it is, false.
func withUsage(body []byte) ([]byte, bool) {
	var stream, opts member
	end, ok := members(body, func(m member) bool {
		switch {
		case bytes.IndexByte(m.key, '\\') >= 0:
			return false // a key the upstream may read as stream or stream_options
		case string(m.key) == "stream":
			stream = m
		case string(m.key) == "stream_options":
			opts = m
		}
		return true
	})
	if !ok || string(stream.val(body)) != "true" {
		return body, false
	}
	const ask = `"include_usage":true`
	splice := func(at, to int, text string) []byte {
		out := make([]byte, 0, len(body)+len(text))
		out = append(append(append(out, body[:at]...), text...), body[to:]...)
		return out
	}
	if opts.key == nil {
		return splice(end, end, `,"stream_options":{`+ask+`}`), true
	}
	v := opts.val(body)
	switch {
	case string(v) == "null":
		return splice(opts.start, opts.end, `{`+ask+`}`), true
	case len(v) == 0 || v[0] != '{':
		return body, false // not an object: the upstream refuses the request
	}
	var usage member
	count := 0
	_, ok = members(v, func(m member) bool {
		if bytes.IndexByte(m.key, '\\') >= 0 {
			return false
		}
		if count++; string(m.key) == "include_usage" {
			usage = m
		}
		return true
	})
	switch {
	case !ok:
		return body, false
	case count == 0:
		return splice(opts.start+1, opts.start+1, ask), true // {}
	case usage.key == nil:
		return splice(opts.start+1, opts.start+1, ask+`,`), true
	case string(usage.val(v)) == "true":
		return body, false // the client asked
	}
	return splice(opts.start+usage.start, opts.start+usage.end, `true`), true
}

// member is a key of a JSON object and its value's span [start, end).
type member struct {
	key        []byte
	start, end int
}

func (m member) val(b []byte) []byte {
	if m.key == nil {
		return nil
	}
	return b[m.start:m.end]
}

// members calls fn with each member of the JSON object b (the root value,
// space around it allowed) until fn returns false, and returns the index
// of the object's closing brace; ok is false for a text that is not one
// object or when fn stopped. Values are skipped, not checked: the upstream
// checks the JSON.
func members(b []byte, fn func(member) bool) (end int, ok bool) {
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return 0, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i, len(bytes.TrimSpace(b[i+1:])) == 0
	}
	for i < len(b) {
		if b[i] != '"' {
			return 0, false
		}
		k := skipString(b, i)
		if k < 0 {
			return 0, false
		}
		key := b[i+1 : k-1]
		i = skipSpace(b, k)
		if i == len(b) || b[i] != ':' {
			return 0, false
		}
		start := skipSpace(b, i+1)
		stop := skipValue(b, start)
		if stop < 0 {
			return 0, false
		}
		if !fn(member{key: key, start: start, end: stop}) {
			return 0, false
		}
		i = skipSpace(b, stop)
		switch {
		case i == len(b):
			return 0, false
		case b[i] == ',':
			i = skipSpace(b, i+1)
		case b[i] == '}':
			return i, len(bytes.TrimSpace(b[i+1:])) == 0
		default:
			return 0, false
		}
	}
	return 0, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] ('"'),
// or -1.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index after the value starting at b[i], or -1: a
// string, a container (its strings skipped, its brackets counted) or a
// scalar (up to the next delimiter).
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				j := skipString(b, i)
				if j < 0 {
					return -1
				}
				i = j - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && !isSpace(b[j]) && b[j] != ',' && b[j] != '}' && b[j] != ']' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// usageStrip keeps the usage event that askUsage asked for from the
// client's text/event-stream: the stream passes event by event, each
// complete event written at once, the bytes of one not yet complete held
// (at most maxHeld: a longer event passes as it comes, never dropped).
// An event whose one data line is a JSON object with "choices": [] and a
// "usage" object is dropped.
type usageStrip struct {
	held []byte
	// lineStart: the next byte starts a line; cr: the last byte was a CR;
	// passing: the current event is past maxHeld; decided: the header was
	// seen; off: the response is not a stream of events (written as is).
	lineStart, cr, passing, decided, off bool
	// stripped counts the events dropped.
	stripped int
}

// maxHeld bounds the bytes of one event held from the client.
const maxHeld = 64 << 10

var stripPool = sync.Pool{New: func() any { return new(usageStrip) }}

func (s *usageStrip) reset() {
	*s = usageStrip{held: s.held[:0], lineStart: true}
}

// header decides, once the response's header is final, whether its body
// is filtered: a 200 text/event-stream, as is (its Content-Length, if
// any, no longer holds).
func (s *usageStrip) header(h http.Header, status int) {
	ce := h.Get("Content-Encoding")
	if status != http.StatusOK || !eventStream(h.Get("Content-Type")) || ce != "" && !strings.EqualFold(ce, "identity") {
		s.off = true
		return
	}
	h.Del("Content-Length")
}

// boundary returns the length of p up to and including the blank line
// that ends an event, or -1 (the scan's state carries over calls).
func (s *usageStrip) boundary(p []byte) int {
	for i, c := range p {
		if s.cr && c == '\n' {
			s.cr = false
			continue
		}
		s.cr = c == '\r'
		if c != '\n' && c != '\r' {
			s.lineStart = false
			continue
		}
		if s.lineStart {
			if c == '\r' && i+1 < len(p) && p[i+1] == '\n' {
				s.cr = false
				return i + 2
			}
			return i + 1
		}
		s.lineStart = true
	}
	return -1
}

// write writes p, the next bytes of the body, to w, less the usage event.
func (s *usageStrip) write(w io.Writer, p []byte) error {
	for len(p) > 0 {
		n := s.boundary(p)
		if n < 0 {
			if s.passing {
				_, err := w.Write(p)
				return err
			}
			if len(s.held)+len(p) > maxHeld {
				s.passing = true
				if err := s.flush(w); err != nil {
					return err
				}
				_, err := w.Write(p)
				return err
			}
			s.held = append(s.held, p...)
			return nil
		}
		var err error
		switch {
		case s.passing:
			s.passing = false
			_, err = w.Write(p[:n])
		case len(s.held) > 0:
			s.held = append(s.held, p[:n]...)
			err = s.emit(w, s.held)
			s.held = s.held[:0]
		default:
			err = s.emit(w, p[:n])
		}
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// flush writes the bytes held (the stream's end: an event never
// completed).
func (s *usageStrip) flush(w io.Writer) error {
	if len(s.held) == 0 {
		return nil
	}
	_, err := w.Write(s.held)
	s.held = s.held[:0]
	return err
}

// emit writes the complete event ev, unless it is the usage event.
func (s *usageStrip) emit(w io.Writer, ev []byte) error {
	if usageEvent(ev) {
		s.stripped++
		return nil
	}
	_, err := w.Write(ev)
	return err
}

// usageEvent reports whether ev is an event of one data line holding a
// JSON object with "choices": [] and a "usage" object.
func usageEvent(ev []byte) bool {
	data, ok := bytes.CutPrefix(ev, []byte("data:"))
	if !ok {
		return false
	}
	data = bytes.TrimRight(data, "\r\n")
	if bytes.IndexAny(data, "\r\n") >= 0 {
		return false // more lines than one
	}
	empty, usage := false, false
	_, ok = members(data, func(m member) bool {
		v := data[m.start:m.end]
		switch string(m.key) {
		case "choices":
			empty = len(v) >= 2 && v[0] == '[' && len(bytes.TrimSpace(v[1:len(v)-1])) == 0
		case "usage":
			usage = len(v) > 0 && v[0] == '{'
		}
		return true
	})
	return ok && empty && usage
}
