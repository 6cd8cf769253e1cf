package sluice

import (
	"errors"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/stores"
	"github.com/sluicehq/caddy-sluice/telemetry"
)

// decider is a layer of the decide stage: it decides an admission's
// planned zones (a.decs, a.store) or says why it could not. The stage is
// composed at Provision (Handler.decideStage): the fail policy over the
// store call (Store.Take).
type decider interface {
	decide(a *admission) error
}

// decideStage composes the decide stage of h, once the controls joined
// theirs, and marks the zones the fail policy may decide apart.
func (h *Handler) decideStage() decider {
	for i, z := range h.zones {
		h.planned[i].FailApart = z.failApart(&h.planned[i])
	}
	call := storeCall{store: h.store, stats: h.storeStats, hooks: h.on[atDecided]}
	var t decider = &failPolicy{next: call, local: h.local, errs: h.storeErrors, logger: h.logger, stats: h.storeStats, problem: h.resp.Problem()}
	for _, c := range controls {
		if c.layer != nil {
			t = c.layer(h, t)
		}
	}
	return t
}

// storeCall is the decide stage's innermost layer: one Take of every
// zone, then the controls' decided hooks on its decisions (a wait for charges in
// flight, inflight.go).
type storeCall struct {
	store Store
	stats *telemetry.StoreMetrics // nil without metrics
	hooks []*control
}

func (c storeCall) decide(a *admission) error {
	a.store = c.store
	start := time.Now()
	err := c.store.Take(a.r.Context(), a.reqs, a.decs)
	a.took = time.Since(start)
	if c.stats != nil {
		c.stats.Observe(a.took)
	}
	if err == nil && len(c.hooks) == 0 {
		a.now = start // the decision's instant, for its headers: one clock reading less
	}
	for _, h := range c.hooks {
		if err != nil {
			break
		}
		err = h.decided(a)
	}
	return err
}

// failPolicy is the decide stage's outer layer: when the store cannot
// decide, each zone's fail policy applies. A fail-closed zone refuses with
// 503; fail-local zones are decided by this instance's memory store
// (all-or-nothing among them); fail-open zones let the request through
// unmetered. A store that decided the request in part (a Cluster shard
// down: algorithms.PartialError, every zone FailApart) has the zones it
// decided stand, and only the others follow their policy (partial).
type failPolicy struct {
	next    decider
	local   Store // the fail-local memory store; nil: no fail-local zone
	errs    *telemetry.SampledLog
	logger  *zap.Logger
	stats   *telemetry.StoreMetrics // nil without metrics
	problem bool                    // the refusal lists the violated policies
}

func (p *failPolicy) decide(a *admission) error {
	err := p.next.decide(a)
	switch {
	case err == nil:
		a.out = decided
		return nil
	case ownAnswer(err):
		return err // the handler's own answer (a client gone while waiting)
	case a.r.Context().Err() != nil:
		// The client went away (or the server is shutting the request
		// down): nothing is served, so nothing is decided, logged or
		// counted as a store failure.
		a.out = unmetered
		return nil
	}
	p.logError(err)
	if p.stats != nil {
		p.stats.Failed(err)
	}
	a.storeErr = err
	p.failover(a, err)
	return nil
}

// ownAnswer reports whether err is the handler's own answer (a Caddy
// error), not a store's failure.
func ownAnswer(err error) bool {
	var he caddyhttp.HandlerError
	return errors.As(err, &he)
}

// failover applies the zones' fail policies to a request the store could
// not decide.
func (p *failPolicy) failover(a *admission, err error) {
	if pe := (*algorithms.PartialError)(nil); errors.As(err, &pe) && len(pe.Failed) == len(a.reqs) {
		p.partial(a, pe.Failed)
		return
	}
	for _, z := range a.zones {
		if z.metrics != nil {
			switch z.fail {
			case failClosedPolicy:
				z.metrics.FailedClosed.Inc()
			case failLocalPolicy:
				z.metrics.FailedLocal.Inc()
			default:
				z.metrics.FailedOpen.Inc()
			}
		}
	}
	n := 0
	for i, z := range a.zones {
		switch z.fail {
		case failClosedPolicy:
			a.v = verdict{zone: z, shown: a.shown[i], key: a.reqs[i].Key,
				Decision: algorithms.Decision{Limit: a.reqs[i].Limit.Capacity(), RetryAfter: failClosedRetryOf(err)}}
			if p.problem {
				a.v.violated = violatedPolicies(a, true)
			}
			a.out = failClosed
			return
		case failLocalPolicy:
			a.reqs[n], a.zones[n], a.shown[n] = a.reqs[i], z, a.shown[i]
			n++
		}
	}
	a.out = unmetered
	if n == 0 || p.local == nil {
		return
	}
	a.reqs, a.zones, a.shown = a.reqs[:n], a.zones[:n], a.shown[:n]
	a.sizeDecs()
	a.store = p.local
	if err := p.local.Take(a.r.Context(), a.reqs, a.decs); err != nil {
		p.logError(err)
		return
	}
	a.out = decided
}

// partial keeps the decisions of a request the store decided in part: of
// the zones it could not decide (failed), each FailApart, the fail open
// ones pass uncharged and the fail local ones are decided by this
// instance's memory store. A local refusal refuses the request, and the
// store's charges of it are given back (docs/redis.md, Redis Cluster).
func (p *failPolicy) partial(a *admission, failed []bool) {
	n := 0
	var local []int // positions in the compacted a of the fail local zones
	for i, z := range a.zones {
		if failed[i] {
			if z.fail == failLocalPolicy && p.local != nil {
				local = append(local, n)
				if z.metrics != nil {
					z.metrics.FailedLocal.Inc()
				}
			} else {
				if z.metrics != nil {
					z.metrics.FailedOpen.Inc()
				}
				continue
			}
		}
		a.reqs[n], a.decs[n], a.zones[n], a.shown[n] = a.reqs[i], a.decs[i], z, a.shown[i]
		n++
	}
	a.out = unmetered
	if n == 0 {
		return
	}
	a.reqs, a.decs, a.zones, a.shown = a.reqs[:n], a.decs[:n], a.zones[:n], a.shown[:n]
	a.out = decided
	if len(local) == 0 {
		return
	}
	lreqs := make([]algorithms.Request, len(local))
	ldecs := make([]algorithms.Decision, len(local))
	for j, i := range local {
		lreqs[j] = a.reqs[i]
	}
	if err := p.local.Take(a.r.Context(), lreqs, ldecs); err != nil {
		p.logError(err)
		for j := range ldecs {
			ldecs[j] = algorithms.Decision{Allowed: true, Limit: lreqs[j].Limit.Capacity(), Remaining: lreqs[j].Limit.Capacity()}
		}
	}
	refused := false
	for j, i := range local {
		a.decs[i] = ldecs[j]
		refused = refused || !ldecs[j].Allowed && !lreqs[j].ReportOnly
	}
	if refused {
		p.giveBack(a, local)
	}
}

// giveBack gives back, as a reservation cancelled, what the store charged
// a's zones but those at local (decided by the memory store), for a
// request a fail-local zone refused; the decisions then show the charges
// given back.
func (p *failPolicy) giveBack(a *admission, local []int) {
	for i := range a.reqs {
		if a.decs[i].Allowed && a.reqs[i].Limit.Algorithm != algorithms.Concurrency && !slices.Contains(local, i) {
			a.decs[i].Remaining += a.reqs[i].Cost
		}
	}
	rs := &a.res
	rs.reserve(a.store, a.reqs, a.decs, a.zones, local)
	_ = rs.give(giveCancel|giveRelease, 0) // a slot not released ends with its lease
	rs.reset()
}

// failApart reports whether a store failure of z may be handled apart
// from the request's other zones (algorithms.Request.FailApart): fail
// open, or fail local on a zone whose request, as the controls planned it
// at Provision, leaves nothing with the store that decided it
// (algorithms.Request.Leaves): what it leaves is given back to the one
// store that decided the whole request.
func (z *zone) failApart(planned *algorithms.Request) bool {
	return z.fail == failOpenPolicy || z.fail == failLocalPolicy && !planned.Leaves()
}

// failClosedRetry is Retry-After on a fail-closed 503 when the store
// cannot say when it will answer: it is unavailable, so the client is
// asked to come back soon, not at a reset.
const failClosedRetry = time.Second

// failClosedRetryOf is the wait a fail-closed 503 asks for: what is left
// of an open circuit breaker's cool-down (a client coming back sooner is
// refused again without Redis being asked), else failClosedRetry.
func failClosedRetryOf(err error) time.Duration {
	var h stores.RetryHinter
	if errors.As(err, &h) {
		if d := h.RetryIn(); d > 0 {
			return d
		}
	}
	return failClosedRetry
}

// logError logs a failed store call (rate-limited).
func (p *failPolicy) logError(err error) {
	if p.errs != nil {
		p.errs.Log(p.logger, zap.ErrorLevel, "rate limit store failed; applying each zone's fail policy", zap.Error(err))
	}
}
