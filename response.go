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
	// a 429 error instead of writing a body here. The rate limit headers
	// and Retry-After are already set on the response, and the
	// {http.rate_limit.*} placeholders are available to those routes.
	HandleErrors bool `json:"handle_errors,omitempty"`

	// StatusCode is the refusal's status. Default: 429.
	StatusCode int `json:"status_code,omitempty"`

	// ContentType is the refusal body's Content-Type. Default:
	// application/json for the default body; for a custom body,
	// application/json when it starts with '{' or '[', text/html when it
	// starts with '<', else text/plain; charset=utf-8.
	ContentType string `json:"content_type,omitempty"`

	// Body is the refusal body, a template with placeholders:
	// {http.rate_limit.zone}, {http.rate_limit.retry_after} (seconds),
	// {http.rate_limit.limit}, {http.rate_limit.remaining},
	// {http.rate_limit.reset} (Unix seconds), and any other Caddy
	// placeholder. Default: a small JSON object with the status, a message,
	// the zone and retry_after.
	Body string `json:"body,omitempty"`

	// Headers are set on the refusal; values may use placeholders.
	Headers http.Header `json:"headers,omitempty"`

	// Problem answers a refusal with an RFC 9457 problem details body
	// (application/problem+json) as draft-ietf-httpapi-ratelimit-headers-11
	// defines it: type quota-exceeded (429) for a refusal, or
	// temporary-reduced-capacity (503) when a fail-closed zone's store could
	// not decide, with title, status, detail and violated-policies (the
	// refusing zones, named as the RateLimit fields name them). Combines
	// with status_code and headers, not with body, content_type or
	// handle_errors.
	Problem bool `json:"problem,omitempty"`
}

// defaultBody is the refusal body when none is configured, as a template.
// refuse renders it without the replacer (appendDefaultBody), with the zone
// name JSON-escaped: the template's {http.rate_limit.zone} is the raw name,
// which a custom JSON body must not hold if it may contain '"' or '\'.
const defaultBody = `{"status":{http.rate_limit.status},"error":"{http.rate_limit.error}","zone":"{http.rate_limit.zone}","retry_after":{http.rate_limit.retry_after}}`

type compiledResponse struct {
	handleErrors bool
	status       int
	contentType  string
	body         string
	// defaultBody: body is defaultBody, which refuse renders without the
	// replacer (appendDefaultBody).
	defaultBody bool
	// problem: the body is the draft's problem details (appendProblem).
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

func (r *Response) compile(c *compiledResponse) error {
	if err := r.validate(); err != nil {
		return err
	}
	*c = compiledResponse{status: http.StatusTooManyRequests, contentType: "application/json", body: defaultBody, defaultBody: true}
	if r == nil {
		return nil
	}
	c.handleErrors = r.HandleErrors
	if r.StatusCode != 0 {
		c.status = r.StatusCode
	}
	if r.Problem {
		c.problem, c.defaultBody, c.body, c.contentType = true, false, "", "application/problem+json"
	}
	if r.Body != "" {
		c.body, c.defaultBody = r.Body, false
		c.contentType = sniffContentType(r.Body)
	}
	if r.ContentType != "" {
		c.contentType = r.ContentType
	}
	c.headers = r.Headers
	return nil
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

// Legacy header names, in canonical form (as net/http sends them).
const (
	hdrLimit     = "X-Ratelimit-Limit"
	hdrRemaining = "X-Ratelimit-Remaining"
	hdrReset     = "X-Ratelimit-Reset"
)

// setLegacyHeaders writes X-RateLimit-Limit, -Remaining and -Reset (Unix
// seconds at which the key is back to full) for one decision. A refusal
// writes the same three values itself, with its other headers (refuse):
// keep the two in step.
func setLegacyHeaders(h http.Header, shown *shownLimit, d *algorithms.Decision, now time.Time) {
	// Both numbers are formatted into one string and sliced out of it, and
	// the three values share one backing array: two allocations in all.
	var buf [40]byte
	b := strconv.AppendInt(buf[:0], d.Remaining, 10)
	split := len(b)
	b = strconv.AppendInt(b, resetUnix(now, d.ResetAfter), 10)
	nums := string(b)
	vals := make([]string, 3)
	vals[0] = shown.limit
	vals[1] = nums[:split]
	vals[2] = nums[split:]
	h[hdrLimit] = vals[0:1:1]
	h[hdrRemaining] = vals[1:2:2]
	h[hdrReset] = vals[2:3:3]
}

// priorLegacyWins reports whether the response already carries the
// X-RateLimit-* headers of a zone at least as constrained as this
// directive's verdict (refused or not, with Retry-After retry, remaining
// and reset Unix seconds): another rate_limit decided the request before
// this one. A refusal beats an allowed zone and the longer Retry-After the
// shorter; between allowed zones the least remaining wins, ties going to
// the later reset, as pick ranks the zones of one directive. Without
// parsable headers (the first directive), it reports false.
func priorLegacyWins(h http.Header, refused bool, retry, remaining, reset int64) bool {
	rem, ok := headerInt(h, hdrRemaining)
	if !ok {
		return false
	}
	if priorRetry, priorRefused := headerInt(h, hdrRetryAfter); priorRefused {
		return !refused || priorRetry >= retry
	} else if refused {
		return false
	}
	rst, ok := headerInt(h, hdrReset)
	return ok && (rem < remaining || rem == remaining && rst >= reset)
}

// headerInt parses the header's value, a decimal integer as this package
// writes them, without allocating.
func headerInt(h http.Header, name string) (int64, bool) {
	v := h[name]
	if len(v) != 1 || v[0] == "" || len(v[0]) > 19 {
		return 0, false
	}
	s, neg := v[0], false
	if s[0] == '-' {
		s, neg = s[1:], true
	}
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// appendToPrior returns v, or, when the response already carries the field
// (another rate_limit decided the request), its value with v's list
// members appended.
func appendToPrior(h http.Header, name, v string) string {
	prior := h[name]
	if len(prior) == 0 || len(prior) == 1 && prior[0] == "" {
		return v
	}
	return strings.Join(prior, ", ") + ", " + v
}

// IETF draft header names (draft-ietf-httpapi-ratelimit-headers), in
// canonical form.
const (
	hdrPolicy = "Ratelimit-Policy"
	hdrState  = "Ratelimit"
)

// formatPolicyItem is the zone's RateLimit-Policy list member under limit
// l, as draft-ietf-httpapi-ratelimit-headers-11 defines it: the policy
// identifier (see zone.setNames), the quota q and the window w (whole
// seconds; a window under a second, or not a whole number of seconds, is
// rounded up, which understates the rate).
//
// The quota unit (qu) is requests, the draft's default, so it is not sent:
// a zone whose requests each cost a static c counts q (and r) in requests,
// its events divided by c. A cost chosen per request cannot be converted:
// q and r then count cost units, which none of the registered units
// (requests, content-bytes, concurrent-requests) names and qu must not
// name otherwise, so the vendor parameter sluice-qu="cost" says so.
func (z *zone) formatPolicyItem(l algorithms.Limit) string {
	w := (l.Window + 999) / 1000
	item := z.sfName + ";q=" + strconv.FormatInt(l.Events/z.draftUnit(), 10) + ";w=" + strconv.FormatInt(w, 10)
	if z.costExpr != nil {
		item += `;sluice-qu="cost"`
	}
	return item
}

// draftUnit is the size, in the zone's events, of the unit its draft
// fields count in: the static cost, or 1 (a cost chosen per request).
func (z *zone) draftUnit() int64 {
	if z.costExpr != nil {
		return 1
	}
	return z.cost
}

// draftFields formats RateLimit-Policy and RateLimit for every zone decided:
// one list member per zone, with the available quota r (in the zone's
// unit: see formatPolicyItem) and, where the decision tells it, the
// effective window t (see effectiveWindow).
func draftFields(s *scratch) (policy, state string) {
	var pb, sb []byte
	var pbuf, sbuf [256]byte
	pb, sb = pbuf[:0], sbuf[:0]
	for i, z := range s.zones {
		if i > 0 {
			pb = append(pb, ", "...)
			sb = append(sb, ", "...)
		}
		pb = append(pb, s.shown[i].policy...)
		d := &s.decs[i]
		unit := z.draftUnit()
		sb = append(sb, z.sfName...)
		sb = append(sb, ";r="...)
		sb = strconv.AppendInt(sb, max(d.Remaining, 0)/unit, 10)
		if t, ok := effectiveWindow(s.reqs[i].Limit, d, unit, s.reqs[i].Cost); ok {
			sb = append(sb, ";t="...)
			sb = strconv.AppendInt(sb, t, 10)
		}
	}
	return string(pb), string(sb)
}

// effectiveWindow is the t parameter of RateLimit (draft -11, section
// 4.1.2: "the number of seconds within which the client can use no more
// than the available quota") for decision d under limit l, with r counted
// in units of unit events: the time until the key has more than r units
// available, or, when it holds all it can, until a client that spent them
// all now could spend one more. In whole seconds rounded up (as Retry-After
// is), so a client that waits t is sure to find more; never 0.
//
//   - token_bucket, gcra: the next unit's refill. The key is full in
//     ResetAfter and refills Events per Window, so it holds the next unit
//     (Capacity − target)·Window/Events earlier. Exact to the millisecond
//     when that product divides evenly, else at most 1ms late.
//   - fixed_window: the end of the current window (ResetAfter); when
//     nothing was counted in it, its end is not in the decision and the
//     whole window, which bounds it, is sent.
//   - sliding_window, sliding_log: not sent (ok false). Their quota comes
//     back as older events leave the window, which the decision does not
//     record; what it does tell (the time to full) would overstate t up to
//     a whole window. t is optional; Retry-After on a refusal is exact.
//
// On a refusal of a request costing one unit the result is at most its
// Retry-After, which the draft asks not to end before the effective
// window.
func effectiveWindow(l algorithms.Limit, d *algorithms.Decision, unit, cost int64) (int64, bool) {
	var ms int64
	switch l.Algorithm {
	case algorithms.TokenBucket, algorithms.GCRA:
		target := (max(d.Remaining, 0)/unit + 1) * unit
		ms = d.ResetAfter.Milliseconds() - floorDiv((l.Capacity()-target)*l.Window, l.Events)
	case algorithms.FixedWindow:
		if ms = d.ResetAfter.Milliseconds(); ms <= 0 {
			ms = l.Window
		}
	default:
		return 0, false
	}
	if !d.Allowed && cost == unit && d.RetryAfter > 0 {
		ms = min(ms, d.RetryAfter.Milliseconds())
	}
	return max(1, (ms+999)/1000), true
}

// floorDiv returns ⌊a/b⌋ for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// resetUnix is the Unix second, rounded up, at which the key is back to full.
func resetUnix(now time.Time, after time.Duration) int64 {
	return ceilSeconds(time.Duration(now.UnixNano()) + after)
}

// ceilSeconds rounds a duration up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
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
	ce := h.refusalLog.check(h.logger, zap.InfoLevel, msg, now)
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
	h.refusalLog.write(ce, fields...)
}

// errRefused is the error handed to handle_errors routes. Its message holds
// the zone name JSON-escaped, so that a route writing it into a JSON string
// ({"error":"{err.message}"}) writes valid JSON; the names of every zone
// accepted before names could hold any character need no escaping.
type errRefused struct{ msg, zone string }

func (e errRefused) Error() string { return e.msg + " in zone " + e.zone }

// refuse answers a refused request: the rate limit headers (X-RateLimit-*,
// RateLimit-Policy and RateLimit, as configured; not on a fail-closed 503),
// Retry-After, Cache-Control: no-store, the placeholders and the event,
// then either the configured body or a Caddy error for the site's
// handle_errors routes. Headers set before (CORS from a header directive,
// say) are kept. unavailable marks the fail-closed refusal: 503, same
// shape, for a store that could not decide.
//
// A refusal must cost less than letting the request through, so with the
// default body it makes three allocations: the placeholders' provider, one
// string holding every number of the headers, and one backing array for
// every header value it sets. The body is rendered into a pooled buffer.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, v *verdict, unavailable bool, now time.Time) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	status, msg := h.resp.status, msgExceeded
	if unavailable {
		status, msg = http.StatusServiceUnavailable, msgUnavailable
	}
	retry := h.retryAfterSeconds(v.RetryAfter)
	reset := resetUnix(now, v.ResetAfter)
	publishPlaceholders(r, repl, refusalVars{
		zone: v.zone.name, msg: msg, status: status,
		retry: retry, limit: v.Limit, remaining: v.Remaining, reset: reset,
	})

	// Building the event costs allocations; skip it when nothing listens.
	if !unavailable && h.events.ShouldEmit(eventExceeded) {
		h.events.Emit(h.ctx, eventExceeded, map[string]any{
			"zone":        v.zone.name,
			"key":         v.key.String(),
			"retry_after": retry,
		})
	}
	h.logRefusal(msg, v, retry, r, repl, now)

	// The default body needs no placeholder: it is rendered first, so that
	// its Content-Length joins the other numbers in one string.
	var bp *[]byte
	var body []byte
	if !h.resp.handleErrors {
		bp = bodyPool.Get().(*[]byte)
		body = (*bp)[:0]
	}
	rendered := !h.resp.handleErrors && (h.resp.defaultBody || h.resp.problem)
	switch {
	case !rendered:
	case h.resp.problem:
		body = appendProblem(body, status, unavailable, msg, retry, v.violated)
	default:
		body = appendDefaultBody(body, status, msg, v.zone.jsonName, retry)
	}

	// An earlier rate_limit may have decided this request (a route with two
	// directives, or an error route after a refusal): the refusal with the
	// longer Retry-After, else this one, gives the X-RateLimit-* headers
	// and Retry-After; the draft fields list the zones of both.
	hdr := w.Header()
	priorRetry, priorRefused := headerInt(hdr, hdrRetryAfter)
	setRetry := !priorRefused || priorRetry < retry
	legacy := h.legacy && !unavailable && !priorLegacyWins(hdr, true, retry, v.Remaining, reset)
	draft := v.policy != "" && !unavailable
	policy, state := v.policy, v.state
	if draft {
		policy, state = appendToPrior(hdr, hdrPolicy, policy), appendToPrior(hdr, hdrState, state)
	}
	var nb [4 * 20]byte
	b := strconv.AppendInt(nb[:0], retry, 10)
	endRetry, endRemaining := len(b), len(b)
	if legacy {
		b = strconv.AppendInt(b, v.Remaining, 10)
		endRemaining = len(b)
		b = strconv.AppendInt(b, reset, 10)
	}
	endReset := len(b)
	if rendered {
		b = strconv.AppendInt(b, int64(len(body)), 10)
	}
	nums := string(b)

	n := 1 // Cache-Control
	if setRetry {
		n++
	}
	if legacy {
		n += 3
	}
	if draft {
		n += 2
	}
	if !h.resp.handleErrors {
		n += 2 // Content-Type, Content-Length
	}
	vals := headerValues(make([]string, n))
	if legacy { // the values setLegacyHeaders writes for an allowed request
		vals.set(hdr, hdrLimit, v.shown.limit)
		vals.set(hdr, hdrRemaining, nums[endRetry:endRemaining])
		vals.set(hdr, hdrReset, nums[endRemaining:endReset])
	}
	if draft {
		vals.set(hdr, hdrPolicy, policy)
		vals.set(hdr, hdrState, state)
	}
	if setRetry {
		vals.set(hdr, hdrRetryAfter, nums[:endRetry])
	}
	vals.set(hdr, hdrCacheControl, "no-store")

	if h.resp.handleErrors {
		return caddyhttp.Error(status, errRefused{msg: msg, zone: v.zone.jsonName})
	}
	for name, hv := range h.resp.headers {
		hdr.Del(name)
		for _, val := range hv {
			hdr.Add(name, repl.ReplaceKnown(val, ""))
		}
	}
	contentLength := nums[endReset:]
	if !rendered {
		// A custom body is rendered once every header but its own two is
		// set, as its placeholders may read them.
		body = append(body, repl.ReplaceKnown(h.resp.body, "")...)
		contentLength = strconv.Itoa(len(body))
	}
	vals.set(hdr, hdrContentType, h.resp.contentType)
	vals.set(hdr, hdrContentLength, contentLength)
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	*bp = body
	putBody(bp)
	return nil
}

// Header names the refusal sets, in canonical form.
const (
	hdrRetryAfter    = "Retry-After"
	hdrCacheControl  = "Cache-Control"
	hdrContentType   = "Content-Type"
	hdrContentLength = "Content-Length"
)

// headerValues hands out header values from one backing array, so that a
// response's headers cost one allocation rather than one each. Each header
// gets a one-element slice whose capacity is also one: a later handler that
// appends to it (Header.Add) gets a new array rather than writing into the
// next header's value, and one that rewrites a value in place (a deferred
// `header` replacement does) touches only that header. The array belongs to
// this one response; nothing else holds it.
type headerValues []string

// set sets the header name (canonical) to val and moves on to the next
// element.
func (hv *headerValues) set(h http.Header, name, val string) {
	s := *hv
	s[0] = val
	h[name] = s[:1:1]
	*hv = s[1:]
}

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

// appendDefaultBody appends the default body: what defaultBody's template
// renders to, with zone already JSON-escaped (zone.jsonName; the messages
// need no escaping).
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

// phPrefix begins the name of every placeholder a refusal sets.
const phPrefix = "http.rate_limit."

// refusalVars are the values of a refusal's {http.rate_limit.*}
// placeholders.
type refusalVars struct {
	zone, msg                      string
	retry, limit, remaining, reset int64
	status                         int
}

// get is the placeholder provider: the value of key, with the same types
// Replacer.Set was given before there was a provider (strings, int64s and
// the status as an int), so every placeholder renders as it did.
func (p refusalVars) get(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, phPrefix)
	if !ok {
		return nil, false
	}
	switch name {
	case "zone", "exceeded.name":
		return p.zone, true
	case "retry_after":
		return p.retry, true
	case "limit":
		return p.limit, true
	case "remaining":
		return p.remaining, true
	case "reset":
		return p.reset, true
	case "status":
		return p.status, true
	case "error":
		return p.msg, true
	}
	return nil, false
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
	if _, inErrorRoute := r.Context().Value(caddyhttp.ErrorCtxKey).(error); inErrorRoute {
		repl.Set(phPrefix+"zone", p.zone)
		repl.Set(phPrefix+"exceeded.name", p.zone)
		repl.Set(phPrefix+"retry_after", p.retry)
		repl.Set(phPrefix+"limit", p.limit)
		repl.Set(phPrefix+"remaining", p.remaining)
		repl.Set(phPrefix+"reset", p.reset)
		repl.Set(phPrefix+"status", p.status)
		repl.Set(phPrefix+"error", p.msg)
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

// sfString serialises s, printable ASCII only (zonename.Policy makes sure),
// as an RFC 9651 sf-string: quoted, with '"' and '\' escaped.
func sfString(s string) string {
	b := make([]byte, 0, len(s)+4)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(append(b, '"'))
}
