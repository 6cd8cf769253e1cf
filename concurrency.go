package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
)

// Concurrency zones: `concurrent <n>` limits how many requests of one key
// are in flight at once. A request takes a slot when it is admitted, in the
// same store call as the request's rate zones (all-or-nothing: refused by
// any zone, it takes no slot and spends no token), and gives it back when
// the handler chain after this one returns, whatever way it returns: a
// response written, an error, a panic, the client gone, a streamed response
// ended (ServeHTTP's deferred done, after.go). The store holds each slot
// under the request's holder id (algorithms.Request.Holder): exactly that
// slot is given back, once.
//
// Beside the other kinds of zone:
//
//   - count (count.go): a concurrency zone counts no status (its slot goes
//     back whatever the response); a request with both gets its count
//     zones' refund and its slots' release in the one post-response step,
//     on every exit path.
//   - delay (delay.go): a slot is taken at admission, and a request
//     admitted to wait for its turn is admitted: it holds its slot while
//     it waits (the slots count the requests admitted and not ended, a
//     waiting one included). A waiter whose client leaves gives its rate
//     zones' reservations back (its waiter) and its slots (the
//     post-response step). A concurrency zone has no delay itself: a
//     request over its slots is refused.
//   - penalty: not for a concurrency zone (a key is refused while it has
//     no free slot, and no longer).
//   - on_exceed pass and report_only: as for a rate zone, a request over
//     the slots passes and takes none.
//   - the deny cache (redisstore) never answers a request with a
//     concurrency zone: when a slot frees is in no state it could run
//     forward.

// defaultLease is a concurrency zone's lease when `lease` is not set:
// well above a typical request, so a slow one is renewed rather than lost,
// and short enough that a crashed instance's slots come back within a
// minute.
const defaultLease = time.Minute

// maxConcurrencyRetry caps the Retry-After a concurrency refusal derives
// from observed hold times (concurrencyZone.retryHint).
const maxConcurrencyRetry = time.Minute

// concurrencyZone is what a concurrency zone keeps at run time.
type concurrencyZone struct {
	// hold is a moving average of the time its requests held a slot on
	// this instance, in nanoseconds (0: none seen yet).
	hold atomic.Int64
	// slots is caddy_rate_limit_concurrent_slots{zone}; nil without
	// metrics.
	slots prometheus.Gauge
}

// isConcurrency reports whether the zone is configured as a concurrency
// zone.
func (z *Zone) isConcurrency() bool {
	return z.Concurrent != 0 || z.ConcurrentFrom != "" || z.Lease != 0
}

// UnmarshalJSON reads a zone as Caddy reads a module (an unknown field is
// an error), noting an explicit "concurrent": 0 so that the check can name
// concurrent rather than the events a rate zone would need.
func (z *Zone) UnmarshalJSON(b []byte) error {
	type plain Zone // without this method
	if err := caddy.StrictUnmarshalJSON(b, (*plain)(z)); err != nil {
		return err
	}
	var set struct {
		Concurrent *int64 `json:"concurrent"`
	}
	z.concurrentZero = json.Unmarshal(b, &set) == nil && set.Concurrent != nil && *set.Concurrent == 0
	return nil
}

// concurrencyLimit compiles a concurrency zone's limit (see Zone.limit),
// with errors naming the field.
func (z *Zone) concurrencyLimit() (algorithms.Limit, error) {
	if z.Concurrent == 0 && z.ConcurrentFrom == "" {
		return algorithms.Limit{}, errors.New("lease applies only to a concurrency zone (set concurrent); a rate zone has no lease")
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"events (max_events)", z.MaxEvents != 0}, {"window", z.Window != 0}, {"burst", z.Burst != 0},
		{"algorithm", z.Algorithm != ""}, {"cost", z.Cost != ""}, {"cost_default", z.CostDefault != 0},
		{"max_events_from", z.MaxEventsFrom != ""}, {"window_from", z.WindowFrom != ""}, {"burst_from", z.BurstFrom != ""},
	} {
		if f.set {
			return algorithms.Limit{}, fmt.Errorf("%s does not apply to a concurrency zone (concurrent): it limits the requests in flight, not a rate; put the rate in a zone of its own", f.name)
		}
	}
	switch {
	case len(z.Count) > 0:
		return algorithms.Limit{}, errors.New("count does not apply to a concurrency zone (concurrent): its slot is given back when the request ends, whatever the response's status; count in a rate zone of its own")
	case z.Penalty != 0:
		return algorithms.Limit{}, errors.New("penalty does not apply to a concurrency zone (concurrent): a key is refused while its slots are in use, and no longer; put the penalty on a rate zone")
	case z.Delay != 0 || z.DelayAfter != 0:
		return algorithms.Limit{}, errors.New("delay does not apply to a concurrency zone (concurrent): a request over its slots is refused, it does not wait for one; delay a rate zone (a request admitted to wait holds its slot while it waits)")
	}
	switch {
	case z.Concurrent == 0:
		return algorithms.Limit{}, errors.New("concurrent_from needs a default: set concurrent too (the limit used when the placeholder's value is unusable)")
	case z.Concurrent < 1 || z.Concurrent > algorithms.MaxConcurrent:
		return algorithms.Limit{}, fmt.Errorf("concurrent must be between 1 and %d, got %d", algorithms.MaxConcurrent, z.Concurrent)
	}
	lease := time.Duration(z.Lease)
	if lease == 0 {
		lease = defaultLease
	}
	if lease%time.Millisecond != 0 {
		return algorithms.Limit{}, fmt.Errorf("lease must be a whole number of milliseconds, got %s", lease)
	}
	l, err := algorithms.NewConcurrencyLimit(z.Concurrent, lease)
	if err != nil {
		return l, fmt.Errorf("lease must be between %s and %s, got %s", time.Duration(algorithms.MinLease)*time.Millisecond,
			time.Duration(algorithms.MaxLease)*time.Millisecond, lease)
	}
	return l, nil
}

// compileConcurrency sets up a concurrency zone's run time and its limit
// chosen per request (concurrent_from); nothing for a rate zone.
func (z *zone) compileConcurrency(cfg *Zone) error {
	if z.limit.Algorithm != algorithms.Concurrency {
		return nil
	}
	z.conc = new(concurrencyZone)
	raw := strings.TrimSpace(cfg.ConcurrentFrom)
	if raw == "" {
		return nil
	}
	c, err := identity.Compile(raw)
	if err != nil || c.Placeholders() == nil {
		return fmt.Errorf("concurrent_from must be a placeholder, such as {plan_concurrent}, got %q", raw)
	}
	// The slots resolve as events do (limitOf), in one count per key.
	z.dyn = &dynamicLimit{events: &c}
	z.dynSpec = "concurrent_from " + raw
	return nil
}

// concurrencyPolicyItem is a concurrency zone's RateLimit-Policy member
// (draft-ietf-httpapi-ratelimit-headers-11): the quota q in the registered
// unit concurrent-requests, and no window (it has none).
func (z *zone) concurrencyPolicyItem(l algorithms.Limit) string {
	return z.sfName + ";q=" + strconv.FormatInt(l.Events, 10) + `;qu="concurrent-requests"`
}

// lease returns a new lease id for a request in zone z (never 0), or 0 in
// a rate zone. Random 64-bit ids: two requests of one key in flight at
// once share one with a probability of about n²/2^65.
func (z *zone) lease() uint64 {
	if z.conc == nil {
		return 0
	}
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// retryHint is a concurrency refusal's Retry-After, from the hold times
// this instance observed in the zone: a slot frees, on average, every
// (average hold time) / n when all n are busy. At least the store's
// (algorithms.ConcurrencyRetry, one second), at most maxConcurrencyRetry.
func (c *concurrencyZone) retryHint(n int64) time.Duration {
	return min(time.Duration(c.hold.Load()/max(n, 1)), maxConcurrencyRetry)
}

// observe folds one hold time into the zone's moving average (weight 1/8:
// about the last dozen requests). Concurrent updates may lose one another's
// sample, which an estimate can afford.
func (c *concurrencyZone) observe(d time.Duration) {
	old := c.hold.Load()
	if old == 0 {
		c.hold.Store(int64(d))
		return
	}
	c.hold.Store(old + (int64(d)-old)/8)
}

// concurrencyHints raises the RetryAfter (and ResetAfter) of the
// concurrency refusals among s's decisions to the zone's retryHint.
func concurrencyHints(s *scratch) {
	for i := range s.decs {
		d, z := &s.decs[i], s.zones[i]
		if d.Allowed || z.conc == nil {
			continue
		}
		if hint := z.conc.retryHint(s.reqs[i].Limit.Events); hint > d.RetryAfter {
			d.RetryAfter, d.ResetAfter = hint, hint
		}
	}
}

// heldSlots are the concurrency slots one running request holds: a part
// of its post-response step (after.go).
type heldSlots struct {
	store releaser
	reqs  []algorithms.Request
	zones []*zone
	start time.Time
	rbuf  [2]algorithms.Request
	zbuf  [2]*zone
}

// holdSlots adds to a (nil: none yet) what the allowed request of s must
// give back, and returns it: the slots s.store (the store that decided)
// granted its concurrency zones (those that allowed; a report-only zone
// that would refuse took none).
func (h *Handler) holdSlots(s *scratch, a *after) *after {
	for i := range s.reqs {
		z := s.zones[i]
		if z.conc == nil || !s.decs[i].Allowed {
			continue
		}
		if a == nil {
			a = h.newAfter()
		}
		hs := &a.slots
		if hs.reqs == nil {
			hs.store, _ = s.store.(releaser) // checked at Provision
			hs.reqs, hs.zones, hs.start = hs.rbuf[:0], hs.zbuf[:0], time.Now()
		}
		hs.reqs = append(hs.reqs, s.reqs[i])
		hs.zones = append(hs.zones, z)
		if z.conc.slots != nil {
			z.conc.slots.Inc()
		}
	}
	return a
}

// releaseSlots gives the slots back to the store that granted them, and
// records how long they were held. Nothing for none.
func (h *Handler) releaseSlots(hs *heldSlots) {
	if len(hs.reqs) == 0 {
		return
	}
	held := time.Since(hs.start)
	if hs.store != nil {
		if err := hs.store.Release(context.Background(), hs.reqs); err != nil {
			h.storeErrors.log(h.logger, zap.ErrorLevel, "rate limit store failed to release concurrency slots; they end with their lease", zap.Error(err))
		}
	}
	for _, z := range hs.zones {
		z.conc.observe(held)
		if z.conc.slots != nil {
			z.conc.slots.Dec()
		}
	}
	clear(hs.rbuf[:])
	clear(hs.zbuf[:])
	hs.reqs, hs.zones, hs.store = nil, nil, nil
}

// provisionConcurrency checks that the stores of a handler with
// concurrency zones can hold slots, sets up their metrics, and has the
// store inherit the slots held elsewhere in its zones. Called by Provision
// once the zones and their metrics exist.
func (h *Handler) provisionConcurrency() error {
	var names []string
	for _, z := range h.zones {
		if z.conc == nil {
			continue
		}
		h.concurrent = true
		names = append(names, z.name)
		if _, ok := h.store.(releaser); !ok {
			return zoneErr(z.name, fmt.Errorf("concurrent: the store (%T) cannot hold concurrency slots", h.store))
		}
		if z.metrics != nil {
			z.conc.slots = metrics.concurrentSlots.WithLabelValues(z.name)
		}
	}
	if _, ok := h.local.(releaser); h.concurrent && h.local != nil && !ok {
		return fmt.Errorf("concurrent: the fail-local store (%T) cannot hold concurrency slots", h.local)
	}
	if heir, ok := h.store.(slotHeir); ok && names != nil {
		heir.InheritSlots(names)
	}
	return nil
}

// concurrency fills in a concurrency zone's fields of the admin API's
// listing.
func (i adminZoneInfo) concurrency(z *zone) adminZoneInfo {
	if z.conc == nil {
		return i
	}
	lease := time.Duration(z.limit.Window) * time.Millisecond
	i.Concurrent, i.Lease, i.LeaseMs = z.limit.Events, lease.String(), z.limit.Window
	i.Events, i.Window, i.WindowMs, i.Burst = 0, "", 0, 0
	return i
}

// showInUse adds the slots in use to a concurrency zone's peek.
func (p *adminPeek) showInUse() {
	inUse := func(s *adminState) {
		n := max(s.Limit-s.Remaining, 0)
		s.InUse = &n
	}
	inUse(&p.adminState)
	for i := range p.Keys {
		inUse(&p.Keys[i].adminState)
	}
}
