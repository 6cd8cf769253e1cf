package sluice

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
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
}

// defaultBody is the refusal body when none is configured. Zone names are
// restricted to characters that need no JSON escaping.
const defaultBody = `{"status":{http.rate_limit.status},"error":"{http.rate_limit.error}","zone":"{http.rate_limit.zone}","retry_after":{http.rate_limit.retry_after}}`

type compiledResponse struct {
	handleErrors bool
	status       int
	contentType  string
	body         string
	headers      http.Header
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
	return nil
}

func (r *Response) compile(c *compiledResponse) error {
	if err := r.validate(); err != nil {
		return err
	}
	*c = compiledResponse{status: http.StatusTooManyRequests, contentType: "application/json", body: defaultBody}
	if r == nil {
		return nil
	}
	c.handleErrors = r.HandleErrors
	if r.StatusCode != 0 {
		c.status = r.StatusCode
	}
	if r.Body != "" {
		c.body = r.Body
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
// seconds at which the key is back to full) for one decision.
func setLegacyHeaders(h http.Header, z *zone, d *algorithms.Decision, now time.Time) {
	// Both numbers are formatted into one string and sliced out of it, and
	// the three values share one backing array: two allocations in all.
	var buf [40]byte
	b := strconv.AppendInt(buf[:0], d.Remaining, 10)
	split := len(b)
	b = strconv.AppendInt(b, resetUnix(now, d.ResetAfter), 10)
	nums := string(b)
	vals := make([]string, 3)
	vals[0] = z.limitText
	vals[1] = nums[:split]
	vals[2] = nums[split:]
	h[hdrLimit] = vals[0:1:1]
	h[hdrRemaining] = vals[1:2:2]
	h[hdrReset] = vals[2:3:3]
}

// IETF draft header names (draft-ietf-httpapi-ratelimit-headers), in
// canonical form.
const (
	hdrPolicy = "Ratelimit-Policy"
	hdrState  = "Ratelimit"
)

// policyItem is a zone's RateLimit-Policy list member: its name, quota
// (q, events) and window (w, whole seconds; a window under a second, or not
// a whole number of seconds, is rounded up, which understates the rate).
func policyItem(name string, l algorithms.Limit) string {
	w := (l.Window + 999) / 1000
	return `"` + name + `";q=` + strconv.FormatInt(l.Events, 10) + ";w=" + strconv.FormatInt(w, 10)
}

// draftFields formats RateLimit-Policy and RateLimit for every zone decided:
// one list member per zone, with the remaining quota (r) and the seconds
// until the key is back to full (t). Zone names need no escaping: they are
// restricted to characters that sf-strings carry as they are.
func draftFields(s *scratch) (policy, state string) {
	var pb, sb []byte
	var pbuf, sbuf [256]byte
	pb, sb = pbuf[:0], sbuf[:0]
	for i, z := range s.zones {
		if i > 0 {
			pb = append(pb, ", "...)
			sb = append(sb, ", "...)
		}
		pb = append(pb, z.policyItem...)
		d := &s.decs[i]
		sb = append(sb, '"')
		sb = append(sb, z.name...)
		sb = append(sb, `";r=`...)
		sb = strconv.AppendInt(sb, max(d.Remaining, 0), 10)
		sb = append(sb, ";t="...)
		sb = strconv.AppendInt(sb, ceilSeconds(d.ResetAfter), 10)
	}
	return string(pb), string(sb)
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
		d += time.Duration(rand.Float64() * h.Jitter * float64(d))
	}
	return max(1, ceilSeconds(d))
}

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
func (h *Handler) logRefusal(msg string, v *verdict, retry int64, repl *caddy.Replacer) {
	lvl := zap.InfoLevel
	if !h.refusalLog.take() {
		return
	}
	if ce := h.logger.Check(lvl, msg); ce != nil {
		fields := []zap.Field{
			zap.String("zone", v.zone.name),
			zap.String("key", v.key.String()),
			zap.Int64("retry_after", retry),
			zap.Int64("cost", v.cost),
			zap.Int64("suppressed_since_last", h.refusalLog.suppressed.Swap(0)),
		}
		if h.LogKey {
			fields = append(fields, zap.String("raw_key", v.zone.deriver.Raw(repl)))
		}
		ce.Write(fields...)
	}
}

// errRefused is the error handed to handle_errors routes.
type errRefused struct{ msg, zone string }

func (e errRefused) Error() string { return e.msg + " in zone " + e.zone }

// refuse answers a refused request: Retry-After, Cache-Control: no-store,
// the placeholders and the event, then either the configured body or a
// Caddy error for the site's handle_errors routes. Headers set before
// (CORS from a header directive, say) are kept. unavailable marks the
// fail-closed refusal: 503, same shape, for a store that could not decide.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, v *verdict, unavailable bool, now time.Time) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	status, msg := h.resp.status, msgExceeded
	if unavailable {
		status, msg = http.StatusServiceUnavailable, msgUnavailable
	}
	retry := h.retryAfterSeconds(v.RetryAfter)
	reset := resetUnix(now, v.ResetAfter)

	hdr := w.Header()
	hdr.Set("Retry-After", strconv.FormatInt(retry, 10))
	hdr.Set("Cache-Control", "no-store")

	repl.Set("http.rate_limit.zone", v.zone.name)
	repl.Set("http.rate_limit.exceeded.name", v.zone.name)
	repl.Set("http.rate_limit.retry_after", retry)
	repl.Set("http.rate_limit.limit", v.Limit)
	repl.Set("http.rate_limit.remaining", v.Remaining)
	repl.Set("http.rate_limit.reset", reset)
	repl.Set("http.rate_limit.status", status)
	repl.Set("http.rate_limit.error", msg)

	// Building the event costs allocations; skip it when nothing listens.
	if !unavailable && h.events.ShouldEmit(eventExceeded) {
		h.events.Emit(h.ctx, eventExceeded, map[string]any{
			"zone":        v.zone.name,
			"key":         v.key.String(),
			"retry_after": retry,
		})
	}
	h.logRefusal(msg, v, retry, repl)

	if h.resp.handleErrors {
		return caddyhttp.Error(status, errRefused{msg: msg, zone: v.zone.name})
	}
	for name, vals := range h.resp.headers {
		hdr.Del(name)
		for _, val := range vals {
			hdr.Add(name, repl.ReplaceKnown(val, ""))
		}
	}
	body := repl.ReplaceKnown(h.resp.body, "")
	hdr.Set("Content-Type", h.resp.contentType)
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = io.WriteString(w, body)
	}
	return nil
}
