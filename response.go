package sluice

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
	"go.uber.org/zap"

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

// compiledResponse is the refusal's shape, compiled at Provision.
type compiledResponse struct {
	handleErrors bool
	status       int
	contentType  string
	// body is a custom body's template; "" for the default body
	// (appendDefaultBody) or, with problem, the problem details
	// (appendProblem).
	body    string
	problem bool
	headers http.Header
}

func (r *Response) validate() error {
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

// compile builds the refusal's shape from a validated Response.
func (r *Response) compile() compiledResponse {
	c := compiledResponse{status: http.StatusTooManyRequests, contentType: "application/json"}
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

// retryAfterSeconds is Retry-After's value: whole seconds rounded up, never
// 0, with the configured jitter added.
func (h *Handler) retryAfterSeconds(d time.Duration) int64 {
	if h.Jitter > 0 {
		// Any jitter ≥ 0 is accepted (caddy-ratelimit's range); the extra
		// time is capped so that a huge one cannot overflow.
		d += time.Duration(min(rand.Float64()*h.Jitter*float64(d), maxJitter))
	}
	return max(1, ceilSeconds(d))
}

// maxJitter caps the time jitter adds to Retry-After: 100 years, the
// longest a key can take to refill (algorithms.MaxRefill).
const maxJitter = float64(algorithms.MaxRefill) * float64(time.Millisecond)

// eventExceeded is the Caddy event emitted on every refusal (the name
// caddy-ratelimit uses).
const eventExceeded = "rate_limit_exceeded"

// Refusal messages, in {http.rate_limit.error} and handle_errors' error.
const (
	msgExceeded    = "rate limit exceeded"
	msgUnavailable = "rate limiter unavailable"
)

// logRefusal writes one line per refusal (zone, key token, retry-after,
// cost), sampled by h.refusalLog so that an attack cannot flood the log.
func (h *Handler) logRefusal(msg string, v *verdict, retry int64, r *http.Request, repl *caddy.Replacer, now time.Time) {
	ce := h.refusalLog.Check(h.logger, zap.InfoLevel, msg, now)
	if ce == nil {
		return
	}
	fields := []zap.Field{
		zap.String("zone", v.zone.name),
		zap.String("key", v.key.String()),
		zap.Int64("retry_after", retry),
		zap.Int64("cost", v.cost),
	}
	if h.LogKey {
		fields = append(fields, zap.String("raw_key", v.zone.deriver.Raw(repl, r)))
	}
	h.refusalLog.Write(ce, fields...)
}

// errRefused is the error handed to handle_errors routes. Its message holds
// the zone name JSON-escaped, so that a route writing it into a JSON string
// ({"error":"{err.message}"}) writes valid JSON; the names of every zone
// accepted before names could hold any character need no escaping.
type errRefused struct{ msg, zone string }

func (e errRefused) Error() string { return e.msg + " in zone " + e.zone }

// refuse answers a refused request: the rate limit headers (as configured;
// not on a fail-closed 503), Retry-After, Cache-Control: no-store, the
// placeholders and the event, then either the configured body or a Caddy
// error for the site's handle_errors routes. Headers set before (CORS from
// a header directive, say) are kept. unavailable marks the fail-closed
// refusal: 503, same shape, for a store that could not decide.
//
// A refusal must cost less than letting the request through: with the
// default body it makes three allocations (the placeholders' provider and
// the headerSet's two), and renders the body into a pooled buffer.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, v *verdict, unavailable bool, now time.Time) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	markRefusal(w)
	status, msg := h.resp.status, msgExceeded
	if unavailable {
		status, msg = http.StatusServiceUnavailable, msgUnavailable
	}
	retry := h.retryAfterSeconds(v.RetryAfter)
	reset := resetUnix(now, v.ResetAfter)
	publishPlaceholders(r, repl, refusalVars{zone: v.zone.name, retry: retry, limit: v.Limit, remaining: v.Remaining, reset: reset,
		msg: msg, status: status})
	// Building the event costs allocations; skip it when nothing listens.
	if !unavailable && h.events.ShouldEmit(eventExceeded) {
		h.events.Emit(h.ctx, eventExceeded, map[string]any{
			"zone":        v.zone.name,
			"key":         v.key.String(),
			"retry_after": retry,
		})
	}
	h.logRefusal(msg, v, retry, r, repl, now)

	// An earlier rate_limit may have refused this request too (a route with
	// two directives, or an error route after a refusal): the longer
	// Retry-After stands, and addLimitHeaders merges the rate limit headers.
	hdr := w.Header()
	var hs headerSet
	if !unavailable {
		h.addLimitHeaders(&hs, hdr, v, true, retry, reset)
	}
	if prior, refused := headerInt(hdr, hdrRetryAfter); !refused || prior < retry {
		hs.addInt(hdrRetryAfter, retry)
	}
	hs.add(hdrCacheControl, "no-store")
	if h.refuseGRPC(w, r, &hs, v, unavailable) || h.refuseConnect(w, r, &hs, v, unavailable) {
		return nil
	}
	if h.resp.handleErrors {
		hs.set(hdr)
		return caddyhttp.Error(status, errRefused{msg: msg, zone: v.zone.jsonName})
	}

	bp := bodyPool.Get().(*[]byte)
	body := (*bp)[:0]
	switch {
	case h.resp.problem:
		body = appendProblem(body, status, unavailable, msg, retry, v.violated)
	case h.resp.body == "":
		body = appendDefaultBody(body, status, msg, v.zone.jsonName, retry)
	}
	if h.resp.body != "" || len(h.resp.headers) > 0 {
		// The response block's headers override the refusal's, and its
		// placeholders (in them and in its body) may read them: they come
		// once those are set, and the body's own two headers last.
		hs.spare = 2
		hs.set(hdr)
		for name, vals := range h.resp.headers {
			hdr.Del(name)
			for _, val := range vals {
				hdr.Add(name, repl.ReplaceKnown(val, ""))
			}
		}
		if h.resp.body != "" {
			body = append(body, repl.ReplaceKnown(h.resp.body, "")...)
		}
	}
	hs.add(hdrContentType, h.resp.contentType)
	if r.Method == http.MethodHead || len(body) > autoContentLength {
		hs.addInt(hdrContentLength, int64(len(body)))
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

// autoContentLength is the longest body whose Content-Length the server
// writes itself: net/http (and its HTTP/2 server) sets it for a body
// written whole before the handler returns that fits its 2 KiB response
// buffer, without a header map entry, which costs every response a copy of
// the map (docs/performance.md). So a refusal sets Content-Length only for
// a HEAD request (no body is written) or a longer body.
const autoContentLength = 2048

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

// appendDefaultBody appends the default refusal body, a small JSON object:
// {"status":429,"error":"rate limit exceeded","zone":"login","retry_after":30},
// with zone already JSON-escaped (zone.jsonName; the messages need no
// escaping).
func appendDefaultBody(b []byte, status int, msg, zone string, retry int64) []byte {
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
// to retry, and violated-policies, the refusing zones (verdict.violated).
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

// publishPlaceholders makes the refusal's placeholders readable by everything
// that runs after it in the request: the response block's templates, the
// handle_errors routes, handlers that wrap this one (log_append, a deferred
// header) and the access log.
//
// They are served by one provider added to the request's replacer, one
// allocation (the closure holding the values), where setting eight static
// values boxed each value and grew the replacer's map. The provider is asked
// only when a placeholder is read, and formats then.
//
// A provider is asked after the replacer's static values, and two providers
// of one request would answer in the order they were added: in an error
// route, where a rate_limit may refuse a request that an earlier one already
// refused, the values are set as static values instead, so that the latest
// refusal is what the error route reads.
func publishPlaceholders(r *http.Request, repl *caddy.Replacer, p refusalVars) {
	if _, inErrorRoute := r.Context().Value(caddyhttp.ErrorCtxKey).(error); inErrorRoute || markedByPass(repl) {
		for _, ph := range placeholders {
			repl.Set(ph.name, ph.value(p))
		}
		return
	}
	repl.Map(func(key string) (any, bool) { return p.get(key) })
}

// jsonEscape returns s escaped for the inside of a JSON string: '"', '\'
// and control characters escaped, everything else (valid UTF-8) as it is.
// It returns s itself when nothing needs escaping.
func jsonEscape(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			return string(appendJSONEscaped(make([]byte, 0, len(s)+8), s))
		}
	}
	return s
}

// appendJSONEscaped appends s escaped as jsonEscape does.
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
