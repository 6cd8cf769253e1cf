package sluice

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// inflightControl: charges in flight (count.go). While count zones' charges
// wait for their statuses, a key may look spent with charges that will
// come back. A request the store refuses only because of them
// (Decision.InFlight) starts no penalty and waits, up to settle_wait, for
// them to settle, asking the store again on a pause that doubles (another
// instance's settlements are seen too), woken at once by this process's
// (settleSignal). It has a seat in the waiting room meanwhile (room
// full: refused at once); a client that leaves gets a 499, charged nothing.
var inflightControl = control{
	name:      "charges in flight",
	provision: provisionInflight,
	derive:    deriveInflight,
	hooks: hooks{
		decided: awaitCharges,
		status:  func(a *admission, _ int) { chargesSettled(a) },
	},
}

// defaultSettleWait is settle_wait's default; maxSettleWait its bound.
const (
	defaultSettleWait = time.Second
	maxSettleWait     = time.Minute
)

// The pauses between the store calls of a wait for charges in flight.
const (
	settlePollFirst = 5 * time.Millisecond
	settlePollMax   = 50 * time.Millisecond
)

// errChargesAbandoned is the error of a request whose client went away
// while it waited for charges in flight.
var errChargesAbandoned = errors.New("the client went away while its request waited for charges in flight to settle; nothing was charged")

// settleWaitOf returns settle_wait, checked (nil: the default).
func settleWaitOf(d *caddy.Duration) (time.Duration, error) {
	if d == nil {
		return defaultSettleWait, nil
	}
	if w := time.Duration(*d); w < 0 || w > maxSettleWait {
		return 0, fmt.Errorf("settle_wait must be between 0 (no waiting) and %s, got %s", maxSettleWait, w)
	}
	return time.Duration(*d), nil
}

// chargesWait is a directive's wait for charges in flight: how long
// (settle_wait; 0: none), and the signal its settlements send.
type chargesWait struct {
	wait    time.Duration
	settled settleSignal
}

// provisionInflight sets settle_wait and the settlements' signal up.
func provisionInflight(h *Handler) (stages, error) {
	h.inflight = new(chargesWait)
	h.inflight.wait, _ = settleWaitOf(h.SettleWait) // checked by Validate
	return 0, nil
}

// chargesSettled wakes the requests waiting for charges in flight in a's
// directive: one of its charges settled.
func chargesSettled(a *admission) {
	a.h.inflight.settled.notify()
}

// deriveInflight has a directive whose planned requests leave charges in
// flight (count, settle) wait for them (decided) and its settlements wake the
// waiters (status).
func deriveInflight(h *Handler) stages {
	if !chargesInFlight(h.planned) {
		if h.SettleWait != nil {
			h.logger.Warn("settle_wait is set, but no zone of this rate_limit has count or settle (or those that do are switched off): nothing waits for charges in flight")
		}
		return 0
	}
	if h.inflight.wait > 0 {
		return joins(atDecided, atStatus)
	}
	return joins(atStatus)
}

// waitsForCharges reports whether s's decisions refuse the request only
// because of charges in flight: an enforcing zone refuses, and every one
// that does says its charges in flight would admit it.
func waitsForCharges(s *admission) bool {
	refused := false
	for i := range s.decs {
		if d := &s.decs[i]; !d.Allowed && !s.reqs[i].ReportOnly {
			if !d.InFlight {
				return false
			}
			refused = true
		}
	}
	return refused
}

// awaitCharges waits, when the store's decisions in s refuse the request
// only because of charges in flight, up to settle_wait, until they no
// longer do, asking the store that decided again on each pause. It returns
// nil with s's last decisions, the store's error, or a 499 error if the
// client leaves first (nothing charged).
func awaitCharges(s *admission) error {
	if !waitsForCharges(s) {
		return nil
	}
	h, r := s.h, s.r
	if !s.enterRoom() {
		return nil // the room is full: refused now
	}
	c := watchClient(r) // net/http alone misses a client leaving before its body is read
	defer c.stop()
	done := c.done()
	t := timerPool.Get().(*time.Timer)
	cw := h.inflight
	woke := cw.settled.join()
	defer func() {
		cw.settled.leave(woke)
		t.Stop()
		timerPool.Put(t)
	}()
	end := time.Now().Add(cw.wait)
	for pause := settlePollFirst; ; pause = min(2*pause, settlePollMax) {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		t.Reset(min(pause, left))
		woken := false
		select {
		case <-t.C:
		case <-woke:
			t.Stop()
			woken = true
		case <-done:
			return caddyhttp.Error(statusClientClosed, errChargesAbandoned)
		}
		err := s.store.Take(r.Context(), s.reqs, s.decs)
		if woken {
			cw.settled.pass(woke) // the next waiter's turn
		}
		if err != nil {
			if r.Context().Err() != nil {
				return caddyhttp.Error(statusClientClosed, errChargesAbandoned)
			}
			return err
		}
		if !waitsForCharges(s) {
			return nil
		}
	}
}

// settleSignal wakes a handler's requests waiting for charges in flight
// when one of its requests settles its charges (in this process: another
// instance's are seen at the next pause), oldest first: a settlement wakes
// the oldest waiter, which, once it has asked the store, wakes the next.
// Free while nobody waits.
type settleSignal struct {
	waiters atomic.Int64
	mu      sync.Mutex
	queue   []chan struct{} // the waiters' wake-ups, oldest first; each holds one
}

// join queues a waiter and returns its wake-up.
func (b *settleSignal) join() chan struct{} {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	b.queue = append(b.queue, ch)
	b.mu.Unlock()
	b.waiters.Add(1)
	return ch
}

// leave removes the waiter of ch, handing a wake-up it did not use to the
// next.
func (b *settleSignal) leave(ch chan struct{}) {
	b.waiters.Add(-1)
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.Index(b.queue, ch)
	if i < 0 {
		return
	}
	b.queue = slices.Delete(b.queue, i, i+1)
	select {
	case <-ch:
		b.wake(i)
	default:
	}
}

// pass wakes the waiter after ch's, which has had its turn.
func (b *settleSignal) pass(ch chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := slices.Index(b.queue, ch); i >= 0 {
		b.wake(i + 1)
	}
}

// notify wakes the oldest waiter, if any. Nil: none.
func (b *settleSignal) notify() {
	if b == nil || b.waiters.Load() == 0 {
		return
	}
	b.mu.Lock()
	b.wake(0)
	b.mu.Unlock()
}

// wake wakes the i-th waiter, if there is one. The caller holds b.mu.
func (b *settleSignal) wake(i int) {
	if i < len(b.queue) {
		select {
		case b.queue[i] <- struct{}{}:
		default: // woken already
		}
	}
}
