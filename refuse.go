package sluice

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/reply"
)

// Response shapes the refusal (package reply writes it).
type Response = reply.Response

// eventExceeded is the Caddy event emitted on every refusal (the name
// caddy-ratelimit uses).
const eventExceeded = "rate_limit_exceeded"

// refuse answers a refused request with verdict v (unavailable: the
// fail-closed 503, for a store that could not decide): it marks the
// response a refusal for earlier directives, publishes the placeholders,
// emits the event, logs the refusal, and has package reply write the
// answer.
//
// With the default body a refusal makes three allocations: the
// placeholders' provider and the headers' two (reply.Shape.Refuse).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, v *verdict, unavailable bool, now time.Time) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	markRefusal(w)
	status, msg := h.resp.Status(unavailable)
	f := reply.Refusal{Zone: v.zone.name, JSONZone: v.zone.jsonName, Limits: v.limits(now), Limit: v.Limit,
		RetryAfter: v.RetryAfter, Retry: h.resp.RetryAfter(v.RetryAfter), Violated: v.violated,
		Penalized: v.zone.limit.Penalty > 0, Unavailable: unavailable}
	reply.Publish(r, repl, reply.Vars{Zone: v.zone.name, Retry: f.Retry, Limit: v.Limit, Remaining: v.Remaining,
		Reset: f.Reset, Msg: msg, Status: status}, markedByPass(repl))
	// Building the event costs allocations; skip it when nothing listens.
	if !unavailable && h.events.ShouldEmit(eventExceeded) {
		h.events.Emit(h.ctx, eventExceeded, map[string]any{
			"zone":        v.zone.name,
			"key":         v.key.String(),
			"retry_after": f.Retry,
		})
	}
	h.logRefusal(msg, v, f.Retry, r, repl, now)
	return h.resp.Refuse(w, r, repl, &f)
}

// limits are the rate limit headers' values of verdict v.
func (v *verdict) limits(now time.Time) reply.Limits {
	l := reply.Limits{Remaining: v.Remaining, Reset: reply.ResetUnix(now, v.ResetAfter), Policy: v.policy, State: v.state}
	if v.shown != nil {
		l.LimitText = v.shown.limit
	}
	return l
}

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

// formatPolicyItem is the zone's RateLimit-Policy list member under limit
// l (reply.PolicyItem; a concurrency zone's in concurrency.go).
func (z *zone) formatPolicyItem(l algorithms.Limit) string {
	if l.Algorithm == algorithms.Concurrency {
		return z.concurrencyPolicyItem(l) // concurrency.go
	}
	return reply.PolicyItem(z.sfName, l, z.draftUnit(), z.costExpr != nil)
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
// one list member per zone (reply.AppendMembers).
func draftFields(s *admission) (policy, state string) {
	var pbuf, sbuf [256]byte
	pb, sb := pbuf[:0], sbuf[:0]
	for i, z := range s.zones {
		pb, sb = reply.AppendMembers(pb, sb, s.shown[i].policy, z.sfName, z.draftUnit(), s.reqs[i].Limit, &s.decs[i], s.reqs[i].Cost)
	}
	return string(pb), string(sb)
}
