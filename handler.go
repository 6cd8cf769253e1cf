package sluice

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/reply"
)

// ServeHTTP admits the request through its stages (admission.go): plan
// (zones, keys, limits, costs), decide (one store call, the fail policy),
// verdict (allow, refuse, wait, pass marked), then the response and the
// obligations that follow it. Controls join the stages (controls.go).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !h.enabled {
		return next.ServeHTTP(w, r)
	}
	if h.pin != nil {
		h.pin.Pin()
		defer h.pin.Unpin()
	}
	a := h.admit(r)
	defer a.exit() // every exit: the slots back, the admission recycled
	if err := a.plan(); err != nil {
		markRefusal(w) // this handler's own answer: counted by no zone
		return err
	}
	if err := a.decide(); err != nil {
		markRefusal(w)
		return err
	}
	a.verdict()
	a.traceVerdict() // on the request's span, when tracing records it
	switch a.out {
	case refuse, failClosed:
		return h.refuse(w, r, &a.v, a.out == failClosed, a.now)
	case allow:
		a.respond(w)
	}
	if err := a.serve(); err != nil {
		markRefusal(w) // never forwarded: earlier count zones give back
		return err
	}
	return a.forward(w, next)
}

// ambiguousKey answers a request whose key, in zone z, reads a request
// field the request carries several times with different values (see
// identity.Deriver.DeriveRequest): no value of it is known to be the
// identity the backend acts on, so the request is refused with 400 Bad
// Request, as a Caddy error (the site's handle_errors routes apply),
// before any store call: no zone is charged and no rate limit header is
// sent. A report-only zone refuses nothing: ambiguousKey returns nil, and
// the zone is left out of the request's decision (not charged, as the
// refusal it reports would charge nothing; the other zones decide). Either
// way the request is counted (ambiguous_key, report_only_ambiguous_key)
// and logged, sampled with the refusals, naming the zone and the field,
// never its values.
func (h *Handler) ambiguousKey(z *zone, field *identity.Ambiguity) error {
	if z.metrics != nil {
		if z.reportOnly {
			z.metrics.ReportOnlyAmbiguous.Inc()
		} else {
			z.metrics.Ambiguous.Inc()
		}
	}
	msg := "rate limit key is ambiguous: request refused with 400"
	if z.reportOnly {
		msg = "rate limit key is ambiguous (report only: passed, not charged in this zone)"
	}
	if ce := h.refusalLog.Check(h.logger, zap.InfoLevel, msg, time.Now()); ce != nil {
		h.refusalLog.Write(ce, zap.String("zone", z.name), zap.String("source", field.Source), zap.String("name", field.Name))
	}
	if z.reportOnly {
		return nil
	}
	return caddyhttp.Error(http.StatusBadRequest, errAmbiguousKey{zone: z.name, field: field})
}

// errAmbiguousKey is the error of a request refused because its key is
// ambiguous. It names the zone and the field, never the field's values.
type errAmbiguousKey struct {
	zone  string
	field *identity.Ambiguity
}

func (e errAmbiguousKey) Error() string {
	return "rate limit key is ambiguous in zone " + e.zone + ": the request carries " +
		e.field.Source + " " + e.field.Name + " several times with different values"
}

// reportWouldRefuse logs the report-only zones that would have refused an
// allowed request (the metric is counted by countDecisions).
func (h *Handler) reportWouldRefuse(s *admission) {
	for i := range s.decs {
		if s.decs[i].Allowed || !s.reqs[i].ReportOnly {
			continue
		}
		msg := "rate limit would be exceeded (report only)"
		if s.zones[i].pass.forward {
			msg = "rate limit exceeded (on_exceed pass: forwarded, marked)"
		}
		if ce := h.refusalLog.Check(h.logger, zap.InfoLevel, msg, time.Now()); ce != nil {
			h.refusalLog.Write(ce,
				zap.String("zone", s.zones[i].name),
				zap.String("key", s.reqs[i].Key.String()),
				zap.Int64("retry_after", reply.CeilSeconds(s.decs[i].RetryAfter)),
				zap.Int64("cost", s.reqs[i].Cost),
			)
		}
	}
}

// violatedPolicies lists the zones that refuse the request (closed: the
// fail-closed zones of a request the store could not decide; else the
// enforcing zones that refused) for the problem body's violated-policies.
func violatedPolicies(s *admission, closed bool) string {
	var buf [128]byte
	b := buf[:0]
	for i, z := range s.zones {
		if closed && z.fail == failClosedPolicy || !closed && !s.decs[i].Allowed && !s.reqs[i].ReportOnly {
			if len(b) > 0 {
				b = append(b, ',')
			}
			b = append(b, z.jsonPolicyID...)
		}
	}
	return string(b)
}
