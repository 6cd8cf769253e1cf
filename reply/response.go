// Package reply writes what a rate_limit directive answers: the refusal
// (429/503 bodies, the problem details, gRPC and Connect answers), the rate
// limit headers of every answer and the placeholders. It takes values, not
// the admission that decided them.
package reply

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Response shapes the refusal, so that a 429 looks like the site's own
// errors.
type Response struct {
	// HandleErrors hands the refusal to the site's handle_errors routes as
	// a 429 error (headers and placeholders set) instead of writing a body.
	HandleErrors bool `json:"handle_errors,omitempty"`

	// StatusCode is the refusal's status, 400 to 599. Default: 429.
	StatusCode int `json:"status_code,omitempty"`

	// ContentType is the body's Content-Type. Default: sniffed from the
	// body (application/json, text/html or text/plain).
	ContentType string `json:"content_type,omitempty"`

	// Body is the refusal body, a template with placeholders such as
	// {http.rate_limit.retry_after}. Default: a small JSON object.
	Body string `json:"body,omitempty"`

	// Headers are set on the refusal; values may use placeholders.
	Headers http.Header `json:"headers,omitempty"`

	// Problem answers with an RFC 9457 problem details body, as
	// draft-ietf-httpapi-ratelimit-headers-11 defines it. Not with Body,
	// ContentType or HandleErrors.
	Problem bool `json:"problem,omitempty"`
}

// Shape is a directive's answer, compiled at Provision: the refusal's
// shape and the settings every answer of the directive reads.
type Shape struct {
	handleErrors bool
	status       int
	contentType  string
	// body is a custom body's template; "" for the default body
	// (appendDefaultBody) or, with problem, the problem details
	// (appendProblem).
	body    string
	problem bool
	headers http.Header

	legacy          bool    // X-RateLimit-* headers
	jitter          float64 // see Settings
	grpcUnavailable bool    // GRPCStatus unavailable
}

// Settings are the directive's options an answer reads besides its
// Response block.
type Settings struct {
	// Legacy sets the X-RateLimit-* headers (headers legacy or both).
	Legacy bool
	// Jitter adds up to this fraction of random time to Retry-After and a
	// gRPC pushback.
	Jitter float64
	// GRPCStatus is the status of a refused gRPC call (CheckGRPCStatus).
	GRPCStatus string
}

// Problem reports whether the refusal is an RFC 9457 problem details body,
// which lists the violated policies (Refusal.Violated).
func (s *Shape) Problem() bool { return s.problem }

// Validate checks the response block (nil: none).
func (r *Response) Validate() error {
	if r == nil {
		return nil
	}
	if r.StatusCode != 0 && (r.StatusCode < 400 || r.StatusCode > 599) {
		return fmt.Errorf("response: status must be between 400 and 599, got %d", r.StatusCode)
	}
	if r.HandleErrors && (r.Body != "" || r.ContentType != "" || len(r.Headers) > 0) {
		return errors.New("response: handle_errors hands the refusal to the site's handle_errors routes; body, content_type and header belong there")
	}
	if r.Problem && (r.Body != "" || r.ContentType != "" || r.HandleErrors) {
		return errors.New("response: problem writes the refusal's body and content type itself (application/problem+json); it takes status and header, not body, content_type or handle_errors")
	}
	return nil
}

// Compile builds the directive's answer from a validated Response (nil:
// none) and its settings.
func (r *Response) Compile(set Settings) Shape {
	c := Shape{status: http.StatusTooManyRequests, contentType: "application/json",
		legacy: set.Legacy, jitter: set.Jitter, grpcUnavailable: set.GRPCStatus == grpcUnavailable}
	if r == nil {
		return c
	}
	c.handleErrors = r.HandleErrors
	if r.StatusCode != 0 {
		c.status = r.StatusCode
	}
	if r.Problem {
		c.problem, c.contentType = true, "application/problem+json"
	}
	if r.Body != "" {
		c.body = r.Body
		c.contentType = sniffContentType(r.Body)
	}
	if r.ContentType != "" {
		c.contentType = r.ContentType
	}
	c.headers = r.Headers
	return c
}

func sniffContentType(body string) string {
	switch t := strings.TrimSpace(body); {
	case strings.HasPrefix(t, "{"), strings.HasPrefix(t, "["):
		return "application/json"
	case strings.HasPrefix(t, "<"):
		return "text/html; charset=utf-8"
	}
	return "text/plain; charset=utf-8"
}

// RetryAfter is Retry-After's value for a request that could pass after d:
// whole seconds rounded up, never 0, with the configured jitter added.
func (s *Shape) RetryAfter(d time.Duration) int64 {
	return max(1, CeilSeconds(s.jittered(d)))
}

// jittered is d with the configured jitter added.
func (s *Shape) jittered(d time.Duration) time.Duration {
	if s.jitter > 0 {
		// Any jitter ≥ 0 is accepted (caddy-ratelimit's range); the extra
		// time is capped so that a huge one cannot overflow.
		d += time.Duration(min(rand.Float64()*s.jitter*float64(d), maxJitter))
	}
	return d
}

// maxJitter caps the time jitter adds to Retry-After: 100 years, the
// longest a key can take to refill (algorithms.MaxRefill).
const maxJitter = float64(algorithms.MaxRefill) * float64(time.Millisecond)

// Refusal messages, in {http.rate_limit.error} and handle_errors' error.
const (
	MsgExceeded    = "rate limit exceeded"
	MsgUnavailable = "rate limiter unavailable"
)

// Status is the refusal's status and message: the configured status, or
// 503 for a fail-closed refusal (unavailable).
func (s *Shape) Status(unavailable bool) (int, string) {
	if unavailable {
		return http.StatusServiceUnavailable, MsgUnavailable
	}
	return s.status, MsgExceeded
}

// Refused is the error handed to handle_errors routes. Its message holds
// the zone name JSON-escaped, so that a route writing it into a JSON string
// ({"error":"{err.message}"}) writes valid JSON; the names of every zone
// accepted before names could hold any character need no escaping.
type Refused struct{ Msg, Zone string }

func (e Refused) Error() string { return e.Msg + " in zone " + e.Zone }

// Refusal is what a refusal shows: the most constrained zone's values.
type Refusal struct {
	Zone     string // the zone's name
	JSONZone string // the zone's name JSON-escaped (JSONEscape)
	Limits          // its rate limit headers' values
	Limit    int64  // the limit, in events
	// RetryAfter is when the request could pass; Retry is Retry-After's
	// value (RetryAfter, jitter added).
	RetryAfter time.Duration
	Retry      int64
	// Violated lists the refusing zones (Problem only), as the members of
	// a JSON array: their policy identifiers, quoted.
	Violated string
	// Penalized: a retry within the zone's penalty is refused again.
	Penalized bool
	// Unavailable marks the fail-closed refusal: 503, no rate limit headers.
	Unavailable bool
}

// Refuse answers a refused request r, whose placeholders (Publish) are set
// in repl: the rate limit headers (as configured; not on a fail-closed
// 503), Retry-After, Cache-Control: no-store, then either the configured
// body, a gRPC or Connect answer, or a Caddy error for the site's
// handle_errors routes. Headers set before (CORS from a header directive,
// say) are kept.
//
// A refusal must cost less than letting the request through: with the
// default body it makes two allocations (the headerSet's), and renders the
// body into a pooled buffer.
func (s *Shape) Refuse(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, f *Refusal) error {
	status, msg := s.Status(f.Unavailable)
	retry := f.Retry
	// An earlier rate_limit may have refused this request too (a route with
	// two directives, or an error route after a refusal): the longer
	// Retry-After stands, and addLimitHeaders merges the rate limit headers.
	hdr := w.Header()
	var hs headerSet
	if !f.Unavailable {
		s.addLimitHeaders(&hs, hdr, &f.Limits, true, retry)
	}
	if prior, refused := headerInt(hdr, HeaderRetryAfter); !refused || prior < retry {
		hs.addInt(HeaderRetryAfter, retry)
	}
	hs.add(HeaderCacheControl, "no-store")
	if s.refuseGRPC(w, r, &hs, f) || refuseConnect(w, r, &hs, f) {
		return nil
	}
	if s.handleErrors {
		hs.set(hdr)
		return caddyhttp.Error(status, Refused{Msg: msg, Zone: f.JSONZone})
	}

	bp := bodyPool.Get().(*[]byte)
	body := (*bp)[:0]
	switch {
	case s.problem:
		body = appendProblem(body, status, f.Unavailable, msg, retry, f.Violated)
	case s.body == "":
		body = AppendDefaultBody(body, status, msg, f.JSONZone, retry)
	}
	if s.body != "" || len(s.headers) > 0 {
		// The response block's headers override the refusal's, and its
		// placeholders (in them and in its body) may read them: they come
		// once those are set, and the body's own two headers last.
		hs.spare = 2
		hs.set(hdr)
		for name, vals := range s.headers {
			hdr.Del(name)
			for _, val := range vals {
				hdr.Add(name, repl.ReplaceKnown(val, ""))
			}
		}
		if s.body != "" {
			body = append(body, repl.ReplaceKnown(s.body, "")...)
		}
	}
	hs.add(HeaderContentType, s.contentType)
	if r.Method == http.MethodHead || len(body) > AutoContentLength {
		hs.addInt(HeaderContentLength, int64(len(body)))
	}
	hs.set(hdr)
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	*bp = body
	putBody(bp)
	return nil
}

// AutoContentLength is the longest body whose Content-Length the server
// writes itself: net/http (and its HTTP/2 server) sets it for a body
// written whole before the handler returns that fits its 2 KiB response
// buffer, without a header map entry, which costs every response a copy of
// the map (docs/performance.md). So a refusal sets Content-Length only for
// a HEAD request (no body is written) or a longer body.
const AutoContentLength = 2048

// bodyPool holds the buffers refusal bodies are rendered into. A buffer goes
// back once written: io.Writer implementations must not retain what they
// are given.
var bodyPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 256)
	return &b
}}

// putBody returns a body buffer to bodyPool, unless it grew large (a big
// custom body) and would keep that memory alive.
func putBody(bp *[]byte) {
	if cap(*bp) > 64<<10 {
		return
	}
	*bp = (*bp)[:0]
	bodyPool.Put(bp)
}

// AppendDefaultBody appends the default refusal body, a small JSON object:
// {"status":429,"error":"rate limit exceeded","zone":"login","retry_after":30},
// with zone already JSON-escaped (JSONEscape; the messages need no
// escaping).
func AppendDefaultBody(b []byte, status int, msg, zone string, retry int64) []byte {
	b = append(b, `{"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"error":"`...)
	b = append(b, msg...)
	b = append(b, `","zone":"`...)
	b = append(b, zone...)
	b = append(b, `","retry_after":`...)
	b = strconv.AppendInt(b, retry, 10)
	return append(b, '}')
}

// Problem types of draft-ietf-httpapi-ratelimit-headers-11 (section 5),
// with their registered titles.
const (
	problemQuotaExceeded   = `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":`
	problemReducedCapacity = `{"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","title":"Temporary Reduced Capacity","status":`
)

// appendProblem appends the RFC 9457 problem details of a refusal
// (response problem): quota-exceeded, or temporary-reduced-capacity for a
// fail-closed refusal (unavailable), with the status, a detail saying when
// to retry, and violated-policies, the refusing zones (Refusal.Violated).
func appendProblem(b []byte, status int, unavailable bool, msg string, retry int64, violated string) []byte {
	if unavailable {
		b = append(b, problemReducedCapacity...)
	} else {
		b = append(b, problemQuotaExceeded...)
	}
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":"`...)
	b = append(b, msg...)
	b = append(b, "; retry after "...)
	b = strconv.AppendInt(b, retry, 10)
	if retry == 1 {
		b = append(b, " second"...)
	} else {
		b = append(b, " seconds"...)
	}
	b = append(b, `","violated-policies":[`...)
	b = append(b, violated...)
	return append(b, "]}"...)
}

// JSONEscape returns s escaped for the inside of a JSON string: '"', '\'
// and control characters escaped, everything else (valid UTF-8) as it is.
// It returns s itself when nothing needs escaping.
func JSONEscape(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			return string(appendJSONEscaped(make([]byte, 0, len(s)+8), s))
		}
	}
	return s
}

// appendJSONEscaped appends s escaped as JSONEscape does.
func appendJSONEscaped(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return b
}
