package sluice

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/reply"
	"github.com/sluicehq/caddy-sluice/telemetry"
)

// delayControl: smoothing (`delay <max_wait>`, `delay_after <n>`;
// token_bucket and gcra). A request a zone would refuse, but whose turn
// comes within max_wait, is admitted later instead: the store reserves its
// turn in the one Store.Take (algorithms/delay.go) and says how long to wait; the
// request then waits here, in a seat of its directive's waiting room
// (max_waiting; room full: decided as if it could not wait, NoDelay). A
// waiter whose client leaves (clientgone.go) cancels its reservation (every
// charge back) and gets a 499. A waiter holds its concurrency slots while
// it waits. delay and delay_after are checked by the zone model
// (zonemodel.Zone.Limit).
var delayControl = control{
	name:      "delay",
	provision: provisionDelay,
	admin: func(z *zone, info *adminZoneInfo) {
		if z.limit.Delay > 0 {
			info.Delay = (time.Duration(z.limit.Delay) * time.Millisecond).String()
			info.DelayAfter = z.limit.DelayAfter
		}
	},
	hooks: hooks{admit: enterWaitingRoom, verdict: waitOf, serve: await},
}

// errWaitAbandoned is the error of a request whose client went away while
// it waited for its turn.
var errWaitAbandoned = errors.New("the client went away while its request waited for its turn; its reservation was given back")

// statusClientClosed is the status Caddy gives a request whose client went
// away (nginx's 499).
const statusClientClosed = 499

// provisionDelay refuses delay zones on a store that cannot give a
// departed waiter's reservation back.
func provisionDelay(h *Handler) (stages, error) {
	delaying := false
	_, canRefund := h.store.(refunder)
	for _, z := range h.zones {
		if z.limit.Delay > 0 {
			if !canRefund {
				return 0, zoneErr(z.name, errors.New("delay: the store cannot give a departed request's reservation back (use store memory or store redis)"))
			}
			delaying = true
		}
	}
	if !delaying {
		return 0, nil
	}
	for i, z := range h.zones {
		// A concurrency zone's slot is released, never refunded.
		h.planned[i].Refundable = z.conc == nil
	}
	return joins(atAdmit, atVerdict, atServe), nil
}

// enterWaitingRoom gets a seat in the handler's waiting room for the
// planned request, or, when the room is full, marks its zones as unable
// to wait.
func enterWaitingRoom(a *admission) {
	if a.enterRoom() {
		return
	}
	for i := range a.reqs {
		a.reqs[i].NoDelay = true
	}
}

// delayTurn is a request's wait for its turn (0: none), asked by zone.
type delayTurn struct {
	wait time.Duration
	zone *zone
}

// waitOf notes the wait of an allowed request: the longest its enforcing
// zones ask (a report-only or on_exceed pass zone never holds a request
// up: its reservation is made, as under enforcement, and not waited for).
// Only a request with a seat in the waiting room waits.
func waitOf(a *admission) {
	best := -1
	for i := range a.decs {
		if a.decs[i].Allowed && a.decs[i].Delay > 0 && !a.reqs[i].ReportOnly && (best < 0 || a.decs[i].Delay > a.decs[best].Delay) {
			best = i
		}
	}
	if best < 0 || a.seat == nil {
		return
	}
	if _, ok := a.store.(refunder); !ok {
		return
	}
	a.turn = delayTurn{wait: a.decs[best].Delay, zone: a.zones[best]}
	a.waits = true
	a.reserve()
}

// await waits for an allowed request's turn, in its seat in the
// waiting room, and sets {http.rate_limit.delay} (0 for a request that
// did not wait, or an unmetered one). If its client went away meanwhile
// (clientgone.go), it cancels the reservation's charges and returns a 499
// error; the slots go back at exit.
func await(a *admission) error {
	if a.turn.wait == 0 {
		markDelay(a.r, 0)
		return nil
	}
	defer a.leaveRoom()
	turn := a.turn
	if m := turn.zone.metrics; m != nil {
		m.Delay.Observe(turn.wait.Seconds())
		telemetry.Metrics.Waiting.Inc()
		defer telemetry.Metrics.Waiting.Dec()
	}
	t := timerPool.Get().(*time.Timer)
	t.Reset(turn.wait)
	defer func() {
		t.Stop()
		timerPool.Put(t)
	}()
	c := watchClient(a.r) // net/http alone misses a client leaving before its body is read
	select {
	case <-t.C:
	case <-c.done():
	}
	if !c.stop() {
		markDelay(a.r, turn.wait)
		return nil
	}
	_ = a.res.give(giveCancel, 0) // refunds only: no error
	if m := turn.zone.metrics; m != nil {
		m.Abandoned.Inc()
	}
	return caddyhttp.Error(statusClientClosed, errWaitAbandoned)
}

// timerPool keeps stopped timers for the waits (a timer per wait would be
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
	if prior, ok := repl.Get(reply.PlaceholderDelay); ok {
		if p, ok := prior.(int64); ok {
			ms += p
		}
	}
	repl.Set(reply.PlaceholderDelay, ms)
}
