package sluice

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
)

// scratch is the per-request working memory of ServeHTTP, pooled so the hot
// path allocates nothing for it.
type scratch struct {
	reqs  []algorithms.Request
	decs  []algorithms.Decision
	zones []*zone
	shown []*shownLimit // what the responses show of each request's limit
	buf   []byte
	store Store // the store that decided (the fail-local fallback's, after a failover)
	// slot is the waiting room's count of the handler this request holds a
	// place in (delay.go), nil for none; release gives the place back.
	slot *atomic.Int64
}

var scratchPool = sync.Pool{New: func() any {
	return &scratch{
		reqs:  make([]algorithms.Request, 0, 8),
		decs:  make([]algorithms.Decision, 0, 8),
		zones: make([]*zone, 0, 8),
		shown: make([]*shownLimit, 0, 8),
		buf:   make([]byte, 0, 256),
	}
}}

func (s *scratch) release() {
	s.reqs, s.decs, s.zones, s.shown = s.reqs[:0], s.decs[:0], s.zones[:0], s.shown[:0]
	s.store = nil
	if s.slot != nil {
		s.slot.Add(-1)
		s.slot = nil
	}
	if cap(s.buf) > 64<<10 {
		s.buf = nil // do not keep a huge key buffer alive
	}
	scratchPool.Put(s)
}

// sizeDecs makes s.decs as long as s.reqs.
func (s *scratch) sizeDecs() {
	if n := len(s.reqs); cap(s.decs) < n {
		s.decs = make([]algorithms.Decision, n)
	} else {
		s.decs = s.decs[:n]
	}
}

// outcome is what a request's decision came to.
type outcome uint8

const (
	pass       outcome = iota // no zone applies, or the store failed open
	allow                     // allowed: headers from the verdict
	refuse                    // refused with 429
	failClosed                // the store failed and a fail-closed zone refuses: 503
)

// verdict is what ServeHTTP keeps of a decision once the scratch is released.
type verdict struct {
	zone  *zone
	shown *shownLimit
	key   identity.Token
	algorithms.Decision
	// policy and state are the RateLimit-Policy and RateLimit field values
	// (headers draft or both), covering every zone decided.
	policy, state string
	// cost is what the request would have spent in the verdict's zone.
	cost int64
	// violated lists the refusing zones (response problem only), as the
	// members of a JSON array: their policy identifiers, quoted.
	violated string
	// after is what an allowed request leaves for once its response is
	// known and the next handlers have returned (after.go): its count
	// zones' settlement, its concurrency slots; nil for none.
	after *after
	// passed is the on_exceed pass zone an allowed request exceeded
	// (pass.go); nil for none.
	passed *passInfo
	// wait is an allowed request's wait for its turn (delay.go); nil for
	// none.
	wait *waiter
}

// ServeHTTP decides the request against every zone that applies, sets the
// rate limit headers, and either passes the request on or refuses it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !h.enabled {
		return next.ServeHTTP(w, r)
	}
	if h.hold != nil {
		h.hold.Hold()
		defer h.hold.Unhold()
	}
	v, out, err := h.decide(r)
	if err != nil {
		// This handler's own answer (an ambiguous key's 400, a waiter
		// whose client left): never forwarded, counted by no zone.
		markRefusal(w)
		return err
	}
	if v.after != nil {
		// On every exit from here on (the next handlers' error or panic,
		// a waiter whose client left), after its status is settled.
		defer v.after.done()
	}
	if out == pass {
		if h.passing {
			h.markPass(r, nil, time.Time{})
		}
		if h.delaying {
			markDelay(r, 0)
		}
		return next.ServeHTTP(w, r)
	}
	now := time.Now()
	if out == allow {
		var hs headerSet
		h.addLimitHeaders(&hs, w.Header(), &v, false, 0, resetUnix(now, v.ResetAfter))
		hs.set(w.Header())
		if h.passing {
			h.markPass(r, v.passed, now)
		}
		if v.wait != nil {
			if err := h.await(r, v.wait); err != nil {
				markRefusal(w) // never forwarded: earlier count zones give back
				return err
			}
		} else if h.delaying {
			markDelay(r, 0)
		}
		if v.after.wantsStatus() {
			return h.serveAfter(w, r, next, v.after)
		}
		return next.ServeHTTP(w, r)
	}
	return h.refuse(w, r, &v, out == failClosed, now)
}

// decide runs the zones that match r through the store in one call and
// returns the verdict to report: the refusing zone with the longest
// Retry-After, else the zone with the least remaining.
func (h *Handler) decide(r *http.Request) (verdict, outcome, error) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	s := scratchPool.Get().(*scratch)
	defer s.release()

	for _, z := range h.zones {
		if len(z.matchers) > 0 {
			match, err := z.matchers.AnyMatchWithError(r)
			if err != nil {
				return verdict{}, pass, err
			}
			if !match {
				continue
			}
		}
		var tok identity.Token
		var cost int64
		var amb *identity.Ambiguity
		tok, s.buf, amb = z.deriver.DeriveRequest(repl, r, s.buf)
		if amb != nil {
			if err := h.ambiguousKey(z, amb); err != nil {
				return verdict{}, pass, err
			}
			continue // report only: this zone decides nothing for the request
		}
		lim, shown := z.limit, &z.shown
		if z.dyn != nil {
			// The limit is chosen per request; a limit other than the
			// default has a bucket of its own (zone.limitOf), and its own
			// header values (zone.shownFor).
			lim, tok, s.buf = z.limitOf(repl, tok, s.buf, h.logger)
			shown = z.shownFor(lim)
		}
		cost, s.buf = z.costOf(repl, s.buf, h.logger)
		// A concurrency zone's slot is never refunded: it is released
		// (after.go), the waiter's departure included.
		s.reqs = append(s.reqs, algorithms.Request{Zone: z.name, Key: tok, Limit: lim, Cost: cost, ReportOnly: z.reportOnly || z.pass,
			Refundable: z.conc == nil && (z.counts != nil || h.delaying), InFlight: z.conc == nil && z.counts != nil, Holder: z.lease(),
			FailApart: z.failApart(h.delaying)})
		s.zones = append(s.zones, z)
		s.shown = append(s.shown, shown)
	}
	if len(s.reqs) == 0 {
		return verdict{}, pass, nil
	}
	s.sizeDecs()
	s.store = h.store
	if h.delaying {
		h.enterWaitingRoom(s)
	}
	start := time.Now()
	err := h.store.Take(r.Context(), s.reqs, s.decs)
	if h.storeStats != nil {
		h.storeStats.observe(start)
	}
	if err == nil && h.settleWait > 0 && h.counting && waitsForCharges(s) {
		if err = h.awaitCharges(r, s); errors.Is(err, errChargesAbandoned) {
			return verdict{}, pass, err
		}
	}
	if err != nil {
		if r.Context().Err() != nil {
			// The client went away (or the server is shutting the request
			// down): nothing is served, so nothing is decided, logged or
			// counted as a store failure.
			return verdict{}, pass, nil
		}
		h.logStoreError(err)
		if h.storeStats != nil {
			h.storeStats.failed(err)
		}
		return h.failover(r, s, err)
	}
	return h.pick(s)
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
			z.metrics.reportOnlyAmbiguous.Inc()
		} else {
			z.metrics.ambiguous.Inc()
		}
	}
	msg := "rate limit key is ambiguous: request refused with 400"
	if z.reportOnly {
		msg = "rate limit key is ambiguous (report only: passed, not charged in this zone)"
	}
	if ce := h.refusalLog.check(h.logger, zap.InfoLevel, msg, time.Now()); ce != nil {
		h.refusalLog.write(ce, zap.String("zone", z.name), zap.String("source", field.Source), zap.String("name", field.Name))
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

// pick chooses the verdict among s's decisions (s.store decided them). A
// report-only zone that would refuse does not refuse: it is counted and
// logged, and its numbers still reach the headers. A concurrency zone's
// refusal first has its Retry-After raised to the zone's hint
// (concurrency.go).
func (h *Handler) pick(s *scratch) (verdict, outcome, error) {
	if h.concurrent {
		concurrencyHints(s)
	}
	best, top := -1, standing{}
	for i := range s.decs {
		d := &s.decs[i]
		st := standing{refused: !d.Allowed && !s.reqs[i].ReportOnly, retry: int64(d.RetryAfter), remaining: d.Remaining, reset: int64(d.ResetAfter)}
		if best < 0 || st.tighter(top) {
			best, top = i, st
		}
	}
	refused := top.refused
	countDecisions(s, refused)
	if !refused {
		h.reportWouldRefuse(s)
	}
	v := verdict{zone: s.zones[best], shown: s.shown[best], key: s.reqs[best].Key, Decision: s.decs[best], cost: s.reqs[best].Cost}
	h.completeVerdict(s, &v, refused)
	if h.draft {
		v.policy, v.state = draftFields(s)
	}
	if refused {
		if h.resp.problem {
			v.violated = violatedPolicies(s, false)
		}
		return v, refuse, nil
	}
	return v, allow, nil
}

// reportWouldRefuse logs the report-only zones that would have refused an
// allowed request (the metric is counted by countDecisions).
func (h *Handler) reportWouldRefuse(s *scratch) {
	for i := range s.decs {
		if s.decs[i].Allowed || !s.reqs[i].ReportOnly {
			continue
		}
		msg := "rate limit would be exceeded (report only)"
		if s.zones[i].pass {
			msg = "rate limit exceeded (on_exceed pass: forwarded, marked)"
		}
		if ce := h.refusalLog.check(h.logger, zap.InfoLevel, msg, time.Now()); ce != nil {
			h.refusalLog.write(ce,
				zap.String("zone", s.zones[i].name),
				zap.String("key", s.reqs[i].Key.String()),
				zap.Int64("retry_after", ceilSeconds(s.decs[i].RetryAfter)),
				zap.Int64("cost", s.reqs[i].Cost),
			)
		}
	}
}

// failover applies each zone's fail policy when the store could not decide:
// a fail-closed zone refuses with 503; fail-local zones are decided by this
// instance's memory store (all-or-nothing among them); fail-open zones let
// the request through unmetered. A store that decided the request in part
// (algorithms.PartialError: a Cluster shard down, its zones each FailApart)
// has the zones it decided stand, and only the others follow their policy
// (partial).
func (h *Handler) failover(r *http.Request, s *scratch, err error) (verdict, outcome, error) {
	if pe := (*algorithms.PartialError)(nil); errors.As(err, &pe) && len(pe.Failed) == len(s.reqs) {
		return h.partial(r, s, pe.Failed)
	}
	for _, z := range s.zones {
		if z.metrics != nil {
			switch z.fail {
			case failClosedPolicy:
				z.metrics.failedClosed.Inc()
			case failLocalPolicy:
				z.metrics.failedLocal.Inc()
			default:
				z.metrics.failedOpen.Inc()
			}
		}
	}
	n := 0
	for i, z := range s.zones {
		switch z.fail {
		case failClosedPolicy:
			v := verdict{zone: z, shown: s.shown[i], key: s.reqs[i].Key,
				Decision: algorithms.Decision{Limit: s.reqs[i].Limit.Capacity(), RetryAfter: failClosedRetry}}
			if h.resp.problem {
				v.violated = violatedPolicies(s, true)
			}
			return v, failClosed, nil
		case failLocalPolicy:
			s.reqs[n], s.zones[n], s.shown[n] = s.reqs[i], z, s.shown[i]
			n++
		}
	}
	if n == 0 || h.local == nil {
		return verdict{}, pass, nil
	}
	s.reqs, s.zones, s.shown = s.reqs[:n], s.zones[:n], s.shown[:n]
	s.sizeDecs()
	s.store = h.local
	if err := h.local.Take(r.Context(), s.reqs, s.decs); err != nil {
		h.logStoreError(err)
		return verdict{}, pass, nil
	}
	return h.pick(s)
}

// partial picks the verdict of a request the store decided in part: the
// zones it decided stand; of those it could not (failed), each FailApart,
// the fail open ones pass uncharged and the fail local ones are decided by
// this instance's memory store. A local refusal refuses the request, and
// the store's charges of it are given back (docs/redis.md, Redis Cluster).
func (h *Handler) partial(r *http.Request, s *scratch, failed []bool) (verdict, outcome, error) {
	n := 0
	var local []int // positions in the compacted s of the fail local zones
	for i, z := range s.zones {
		if failed[i] {
			if z.fail == failLocalPolicy && h.local != nil {
				local = append(local, n)
				if z.metrics != nil {
					z.metrics.failedLocal.Inc()
				}
			} else {
				if z.metrics != nil {
					z.metrics.failedOpen.Inc()
				}
				continue
			}
		}
		s.reqs[n], s.decs[n], s.zones[n], s.shown[n] = s.reqs[i], s.decs[i], z, s.shown[i]
		n++
	}
	if n == 0 {
		return verdict{}, pass, nil
	}
	s.reqs, s.decs, s.zones, s.shown = s.reqs[:n], s.decs[:n], s.zones[:n], s.shown[:n]
	if len(local) == 0 {
		return h.pick(s)
	}
	lreqs := make([]algorithms.Request, len(local))
	ldecs := make([]algorithms.Decision, len(local))
	for j, i := range local {
		lreqs[j] = s.reqs[i]
	}
	if err := h.local.Take(r.Context(), lreqs, ldecs); err != nil {
		h.logStoreError(err)
		for j := range ldecs {
			ldecs[j] = algorithms.Decision{Allowed: true, Limit: lreqs[j].Limit.Capacity(), Remaining: lreqs[j].Limit.Capacity()}
		}
	}
	refused := false
	for j, i := range local {
		s.decs[i] = ldecs[j]
		refused = refused || !ldecs[j].Allowed && !lreqs[j].ReportOnly
	}
	if refused {
		h.giveBack(s, local)
	}
	return h.pick(s)
}

// failApart reports whether a store failure of z may be handled apart
// from the request's other zones (algorithms.Request.FailApart): fail
// open, or fail local on a zone that leaves nothing for after the decision
// (no count, concurrency slot or wait: those are settled in the one store
// that decided the request).
func (z *zone) failApart(delaying bool) bool {
	return z.fail == failOpenPolicy || z.fail == failLocalPolicy && z.conc == nil && z.counts == nil && !delaying
}

// giveBack returns what the store charged s's zones (but those at local,
// decided by the memory store), for a request a fail local zone refused
// after the store decided the others: as a count zone's refund, without
// waiting.
func (h *Handler) giveBack(s *scratch, local []int) {
	var refunds []algorithms.Refund
	var leases []algorithms.Request
	for i := range s.reqs {
		rq, d := &s.reqs[i], &s.decs[i]
		if slices.Contains(local, i) || !d.Allowed {
			continue
		}
		if rq.Holder != 0 {
			leases = append(leases, *rq)
			continue
		}
		refunds = append(refunds, algorithms.Refund{Zone: rq.Zone, Key: rq.Key, Limit: rq.Limit, Cost: rq.Cost, At: d.At, InFlight: rq.InFlight})
		d.Remaining += rq.Cost
	}
	if rf, ok := h.store.(refunder); ok && len(refunds) > 0 {
		_ = rf.Refund(context.Background(), refunds)
	}
	if rl, ok := h.store.(releaser); ok && len(leases) > 0 {
		_ = rl.Release(context.Background(), leases)
	}
}

// violatedPolicies lists the zones that refuse the request (closed: the
// fail-closed zones of a request the store could not decide; else the
// enforcing zones that refused) for the problem body's violated-policies.
func violatedPolicies(s *scratch, closed bool) string {
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

// failClosedRetry is Retry-After on a fail-closed 503: the store is
// unavailable, so the client is asked to come back soon, not at a reset.
const failClosedRetry = time.Second

// logStoreError logs a failed store call (rate-limited).
func (h *Handler) logStoreError(err error) {
	h.storeErrors.log(h.logger, zap.ErrorLevel, "rate limit store failed; applying each zone's fail policy", zap.Error(err))
}
