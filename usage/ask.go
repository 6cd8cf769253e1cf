package usage

import (
	"bytes"
	"io"
	"net/http"
	"strings"
)

// OutputBound returns the largest of the request's output bounds
// (max_completion_tokens, max_tokens, max_output_tokens: chat completions,
// completions and Anthropic's, the Responses API), 0 for none.
func OutputBound(body []byte) int64 {
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
	return min(most, MaxAmount)
}

// CompletionsPath reports whether an API path is OpenAI's chat completions
// or completions (/v1/chat/completions, /openai/deployments/x/completions).
func CompletionsPath(p string) bool {
	return strings.HasSuffix(p, "/chat/completions") || strings.HasSuffix(p, "/completions")
}

// WithUsage returns body asking for usage, and true, when body is a
// streamed request that does not ask for it; else body as it is, false.
func WithUsage(body []byte) ([]byte, bool) {
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

// Strip keeps the usage event a rewrite (WithUsage) asked for from the
// client's text/event-stream: the stream passes event by event, each
// complete event written at once, the bytes of one not yet complete held
// (at most maxHeld: a longer event passes as it comes, never dropped).
// An event whose one data line is a JSON object with "choices": [] and a
// "usage" object is dropped.
type Strip struct {
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

// Reset readies s for a new response.
func (s *Strip) Reset() {
	*s = Strip{held: s.held[:0], lineStart: true}
}

// Header decides, once the response's header is final (its first call),
// whether its body is filtered: a 200 text/event-stream, as is (its
// Content-Length, if any, no longer holds).
func (s *Strip) Header(h http.Header, status int) {
	if s.decided {
		return
	}
	s.decided = true
	ce := h.Get("Content-Encoding")
	if status != http.StatusOK || !EventStream(h.Get("Content-Type")) || ce != "" && !strings.EqualFold(ce, "identity") {
		s.off = true
		return
	}
	h.Del("Content-Length")
}

// boundary returns the length of p up to and including the blank line
// that ends an event, or -1 (the scan's state carries over calls).
func (s *Strip) boundary(p []byte) int {
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

// Filters reports whether the body is filtered (decided by Header).
func (s *Strip) Filters() bool { return s.decided && !s.off }

// Write writes p, the next bytes of the body, to w, less the usage event.
func (s *Strip) Write(w io.Writer, p []byte) error {
	for len(p) > 0 {
		n := s.boundary(p)
		if n < 0 {
			if s.passing {
				_, err := w.Write(p)
				return err
			}
			if len(s.held)+len(p) > maxHeld {
				s.passing = true
				if err := s.Flush(w); err != nil {
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

// Flush writes the bytes held (the stream's end: an event never
// completed).
func (s *Strip) Flush(w io.Writer) error {
	if len(s.held) == 0 {
		return nil
	}
	_, err := w.Write(s.held)
	s.held = s.held[:0]
	return err
}

// emit writes the complete event ev, unless it is the usage event.
func (s *Strip) emit(w io.Writer, ev []byte) error {
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

// parseCount parses a positive decimal integer (digits only, at most
// 2^62), as a rate_limit field's count.
func parseCount(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, n >= 1 && n <= 1<<62
}
