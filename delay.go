package sluice

import (
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Smoothing (`delay <max_wait>`, `delay_after <n>`; token_bucket and gcra):
// a request a zone would refuse, but whose turn comes within max_wait, is
// admitted later instead. The store reserves its slot in the one call that
// decides the request's zones (algorithms/delay.go: all-or-nothing, the
// schedule decided atomically, the same in memory and in Redis) and says
// how long to wait; the handler sends nothing meanwhile, then passes the
// request on, with the headers of its decision and {http.rate_limit.delay}
// (the wait, in milliseconds) for the access log.
//
// Bounded: a directive holds at most max_waiting requests in its waiting
// room. A request takes its place before the store call (one atomic add);
// when the room is full it is decided as if it could not wait
// (Request.NoDelay): it passes if it fits the bucket, else it is refused,
// and nothing is reserved for a request that will not wait. A request
// that need not wait gives its place back at once.
//
// A waiting request whose client goes away (the client closed the
// connection or reset the stream, which clientgone.go notices even before
// the request's body is read; or the server is shutting down and gave up
// on it) stops waiting at once and gives every charge of the request back, its
// reservation included: for the delay zones exactly, as if it had never
// come (algorithms/delay.go); the requests already waiting keep their
// turns. Its handler returns a 499 error (Caddy's status for a client that
// went away). A reload or a shutdown does not cut a wait short: Caddy lets
// the old server's requests finish, and a wait ends within max_wait; a
// server that stops waiting for its requests ends their contexts, as a
// client going away does.
//
// Beside a concurrency zone (concurrency.go): the request's slot is taken
// in the same store call, at admission, and an admission that waits is
// admitted, so a waiting request holds its slot while it waits (a key's
// slots bound its requests waiting and running together). A waiter whose
// client leaves gives its slots back too, with its reservations.

// defaultMaxWaiting is max_waiting's default.
const defaultMaxWaiting = 1000

// errWaitAbandoned is the error of a request whose client went away while
// it waited for its turn.
var errWaitAbandoned = errors.New("the client went away while its request waited for its turn; its reservation was given back")

// statusClientClosed is the status Caddy gives a request whose client went
// away (nginx's 499).
const statusClientClosed = 499

// waitingRoom counts the requests of a handler holding a place to wait
// (n), at most max.
type waitingRoom struct {
	n   atomic.Int64
	max int64
}

// enterWaitingRoom takes a place in the handler's waiting room for the
// request decided in s, or, when the room is full, marks its zones as
// unable to wait.
//
// (One compare-and-swap per request of a directive with a delay zone.)
func (h *Handler) enterWaitingRoom(s *scratch) {
	if h.room.enter() {
		s.slot = &h.room.n
		return
	}
	for i := range s.reqs {
		s.reqs[i].NoDelay = true
	}
}

// enter takes a place in the room, if one is free; the place goes back
// with n.Add(-1).
func (room *waitingRoom) enter() bool {
	for n := room.n.Load(); n < room.max; n = room.n.Load() {
		if room.n.CompareAndSwap(n, n+1) { // never past max, even for a moment
			return true
		}
	}
	return false
}

// waiter is an allowed request's wait for its turn: how long, the zone
// that asks it longest (for the metrics), what to give back if its client
// goes away (every charge of the request's rate zones; its concurrency
// slots go back with its post-response step, after.go), and its place in
// the waiting room. Pooled.
type waiter struct {
	delay   time.Duration
	zone    *zone
	store   refunder
	refunds []algorithms.Refund
	zones   []*zone
	slot    interface{ Add(int64) int64 }
}

var waiterPool = sync.Pool{New: func() any { return &waiter{refunds: make([]algorithms.Refund, 0, 2)} }}

// waiterOf returns the wait of a decided, allowed request, or nil when it
// need not wait (its place in the waiting room then goes back with the
// scratch).
func (h *Handler) waiterOf(s *scratch) *waiter {
	best := -1
	for i := range s.decs {
		// A report-only (or on_exceed pass) zone never holds a request up:
		// its reservation is made, as under enforcement, and not waited for.
		if s.decs[i].Allowed && s.decs[i].Delay > 0 && !s.reqs[i].ReportOnly && (best < 0 || s.decs[i].Delay > s.decs[best].Delay) {
			best = i
		}
	}
	if best < 0 || s.slot == nil {
		return nil
	}
	rf, ok := s.store.(refunder)
	if !ok {
		return nil
	}
	w := waiterPool.Get().(*waiter)
	w.delay, w.zone, w.store = s.decs[best].Delay, s.zones[best], rf
	for i := range s.reqs {
		// Charged (a report-only zone that would refuse was not); a
		// concurrency zone's slot is released, not refunded.
		if s.decs[i].Allowed && s.zones[i].conc == nil {
			r := &s.reqs[i]
			w.refunds = append(w.refunds, algorithms.Refund{Zone: r.Zone, Key: r.Key, Limit: r.Limit, Cost: r.Cost, At: s.decs[i].At, InFlight: r.InFlight})
			w.zones = append(w.zones, s.zones[i])
		}
	}
	w.slot, s.slot = s.slot, nil // the place is the waiter's now
	return w
}

// await waits for the request's turn. If its client went away meanwhile
// (clientgone.go), it gives every charge back and returns a 499 error;
// the request's post-response step (after.go) then only gives its
// concurrency slots back (no status is known: its count zones, whose
// charges the waiter gave back, are not settled).
func (h *Handler) await(r *http.Request, w *waiter) error {
	defer w.release()
	if m := w.zone.metrics; m != nil {
		m.delay.Observe(w.delay.Seconds())
		metrics.waiting.Inc()
		defer metrics.waiting.Dec()
	}
	t := timerPool.Get().(*time.Timer)
	t.Reset(w.delay)
	defer func() {
		t.Stop()
		timerPool.Put(t)
	}()
	c := watchClient(r) // net/http alone misses a client leaving before its body is read
	select {
	case <-t.C:
	case <-c.done():
	}
	if !c.stop() {
		markDelay(r, w.delay)
		return nil
	}
	_ = w.store.Refund(r.Context(), w.refunds) // the stores give back whatever the context
	if m := w.zone.metrics; m != nil {
		m.abandoned.Inc()
	}
	return caddyhttp.Error(statusClientClosed, errWaitAbandoned)
}

// release gives the waiter's place in the waiting room back and returns
// it to the pool.
func (w *waiter) release() {
	w.slot.Add(-1)
	clear(w.refunds)
	clear(w.zones)
	*w = waiter{refunds: w.refunds[:0], zones: w.zones[:0]}
	waiterPool.Put(w)
}

// timerPool holds stopped timers for the waits (a timer per wait would be
// an allocation per delayed request).
var timerPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// markDelay adds d to {http.rate_limit.delay}, the milliseconds the request
// waited for its turn (0 for none: a directive with a delay zone sets it on
// every request it lets through, so that header_up, which sends an unknown
// placeholder as its literal text, always sends a number; a request that
// waited in two directives waited the sum).
func markDelay(r *http.Request, d time.Duration) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	ms := d.Milliseconds()
	if prior, ok := repl.Get(phDelay); ok {
		if p, ok := prior.(int64); ok {
			ms += p
		}
	}
	repl.Set(phDelay, ms)
}
