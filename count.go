package sluice

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// A zone that counts only some responses (`count 401 403`, `count 4xx`):
// the request is charged before it runs, in the one store call with the
// request's other zones (so a spent budget refuses it atomically: N
// concurrent guesses cannot all pass a check and be charged afterwards),
// and the charge is given back when the response's status is known and
// not one the zone counts; never the reverse (nothing is charged after the
// response). A refused request is not forwarded, so it has no status to
// count. Until then the charge is in flight (inflight.go).
//
// The give-back is a part of the post-response step (after.go): it runs
// as soon as the status is known (a streamed response's first write),
// through the store that charged (the fail-local memory store when it
// decided), and never delays the response: the memory store gives back
// under its shard's lock, the Redis store hands one pipelined script call
// to its workers and returns (redisstore/refund.go). How exact a refund
// is, per algorithm: algorithms/refund.go.

// statusSet is a set of HTTP statuses, 100 to 599.
type statusSet [10]uint64

func (s *statusSet) add(code int) { s[code>>6] |= 1 << (code & 63) }
func (s *statusSet) has(code int) bool {
	return code >= 0 && code < 640 && s[code>>6]&(1<<(code&63)) != 0
}
func (s *statusSet) addRange(lo, hi int) {
	for c := lo; c <= hi; c++ {
		s.add(c)
	}
}

// parseStatuses compiles `count`'s items: codes (401), classes (4xx) and
// ranges (500-599), 100 to 599.
func parseStatuses(items []string) (*statusSet, error) {
	var s statusSet
	code := func(v string) (int, bool) {
		n, err := strconv.Atoi(v)
		return n, err == nil && len(v) == 3 && n >= 100 && n <= 599
	}
	for _, it := range items {
		lower := strings.ToLower(strings.TrimSpace(it))
		if lo, hi, ok := strings.Cut(lower, "-"); ok {
			a, okA := code(lo)
			b, okB := code(hi)
			if !okA || !okB || a > b {
				return nil, fmt.Errorf("count: %q is not a range of statuses (500-599)", it)
			}
			s.addRange(a, b)
			continue
		}
		if len(lower) == 3 && lower[1:] == "xx" && lower[0] >= '1' && lower[0] <= '5' {
			c := int(lower[0]-'0') * 100
			s.addRange(c, c+99)
			continue
		}
		c, ok := code(lower)
		if !ok {
			return nil, fmt.Errorf("count: %q is not a status: write a code from 100 to 599 (401), a class (4xx) or a range (500-599)", it)
		}
		s.add(c)
	}
	return &s, nil
}

// compileOutcomes compiles what the zone does with responses and would-be
// refusals: count (above) and on_exceed (pass.go).
func (z *zone) compileOutcomes(cfg *Zone) error {
	if len(cfg.Count) > 0 {
		set, err := parseStatuses(cfg.Count)
		if err != nil {
			return err
		}
		z.counts, z.countSpec = set, cfg.Count
	}
	switch cfg.OnExceed {
	case "", onExceedRefuse:
	case onExceedPass:
		// Under a report-only directive, the zone is report-only: nothing
		// is handed on (Handler.Validate refuses both on one zone).
		z.pass = !cfg.ReportOnly
	default:
		return fmt.Errorf("on_exceed: unknown action %q (known: refuse, pass)", cfg.OnExceed)
	}
	return nil
}

// provisionOutcomes notes whether any zone counts only some statuses or
// forwards its would-be refusals (the hot path then looks for them), and
// refuses count zones on a store that cannot give charges back.
func (h *Handler) provisionOutcomes() error {
	_, canRefund := h.store.(refunder)
	h.room = &waitingRoom{max: defaultMaxWaiting}
	if h.MaxWaiting > 0 {
		h.room.max = int64(h.MaxWaiting)
	}
	h.settleWait, _ = settleWaitOf(h.SettleWait) // checked by Validate
	h.settled = new(settleSignal)
	for _, z := range h.zones {
		if z.limit.Delay > 0 {
			if !canRefund {
				return zoneErr(z.name, errors.New("delay: the store cannot give a departed request's reservation back (use store memory or store redis)"))
			}
			h.delaying = true
		}
		if z.pass && !h.passing {
			h.passing = true
			passDirectives.Add(1) // Cleanup takes it back
		}
		if z.counts != nil {
			if !canRefund {
				return zoneErr(z.name, errors.New("count: the store cannot give charges back (use store memory or store redis)"))
			}
			h.counting = true
		}
	}
	if hs, ok := h.store.(storeHolder); ok && (h.counting || h.delaying) {
		h.hold = hs
	}
	return nil
}

// settlement is what an allowed request owes its count zones: the charges
// to give back unless the response's status counts. It is a part of the
// post-response step (after.go).
type settlement struct {
	store   refunder
	refunds []algorithms.Refund
	counts  []*statusSet
	zones   []*zone
}

// settleCounts adds to a (nil: none yet) the settlement of a decided,
// allowed request: its count zones that were charged (a report-only zone
// that would refuse was not), and returns it. s.store is the store that
// decided. Only count zones are settled: the other zones of a directive
// that counts or delays are refundable too (Request.Refundable), but only
// for a waiter that leaves (delay.go).
func (h *Handler) settleCounts(s *scratch, a *after) *after {
	for i := range s.reqs {
		z := s.zones[i]
		if z.counts == nil || !s.decs[i].Allowed {
			continue
		}
		rf, ok := s.store.(refunder)
		if !ok {
			return a
		}
		if a == nil {
			a = h.newAfter()
		}
		st := &a.settle
		st.store = rf
		r := &s.reqs[i]
		st.refunds = append(st.refunds, algorithms.Refund{Zone: r.Zone, Key: r.Key, Limit: r.Limit, Cost: r.Cost, At: s.decs[i].At, InFlight: r.InFlight})
		st.counts = append(st.counts, z.counts)
		st.zones = append(st.zones, z)
	}
	return a
}

// The statuses statusKnown takes besides the response's own.
const (
	// statusRefusal: the response is a rate_limit handler's own refusal (a
	// later directive's): no zone counts it.
	statusRefusal = 0
	// statusUnknown: the client left before the status was known: every
	// zone counts it (the request was forwarded; its charge stays).
	statusUnknown = -1
)

// statusKnown settles the charges, in one store call: those of the zones
// that do not count status are given back, the others kept.
func (st *settlement) statusKnown(status int) {
	for i := range st.refunds {
		r := &st.refunds[i]
		r.Keep = status == statusUnknown || st.counts[i].has(status)
		if m := st.zones[i].metrics; m != nil && !r.Keep {
			m.refunded.Inc()
		}
	}
	// The store never fails a refund (a lost one is the store's to count);
	// the request's context may be gone with its client.
	_ = st.store.Refund(context.Background(), st.refunds)
}

// reset empties the settlement, keeping its slices for the next request.
func (st *settlement) reset() {
	clear(st.refunds)
	clear(st.counts)
	clear(st.zones)
	st.refunds, st.counts, st.zones = st.refunds[:0], st.counts[:0], st.zones[:0]
	st.store = nil
}

// outcomesInfo adds the zone's count, on_exceed, penalty and delay to its
// admin listing.
func outcomesInfo(z *zone, info *adminZoneInfo) {
	info.Count = z.countSpec
	if z.pass {
		info.OnExceed = onExceedPass
	}
	if z.limit.Penalty > 0 {
		info.Penalty = (time.Duration(z.limit.Penalty) * time.Millisecond).String()
	}
	if z.limit.Delay > 0 {
		info.Delay = (time.Duration(z.limit.Delay) * time.Millisecond).String()
		info.DelayAfter = z.limit.DelayAfter
	}
}
