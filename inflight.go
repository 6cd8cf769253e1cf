package sluice

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Charges in flight (count.go): a count zone's charge is taken before the
// request runs and settled when its status is known, so while responses
// are on their way a key may look spent with charges that will come back
// (right-password logins). The store knows how much of a key is in flight
// (algorithms/inflight.go); a request that it refuses only because of them
// (Decision.InFlight: given back, they would admit it) starts no penalty,
// and waits, up to settle_wait, for them to settle: the store is asked
// again on a short pause that doubles, so a charge given back on another
// instance is seen too. The waiter holds a place in the directive's
// waiting room (max_waiting; room full: refused at once). When its client
// leaves, it stops waiting, charges nothing and returns 499. When the wait
// ends with the charges still in flight, the request is refused (no
// penalty); when they settled as counted, the store's refusal stands (and
// a penalty may start then).

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

// waitsForCharges reports whether s's decisions refuse the request only
// because of charges in flight: an enforcing zone refuses, and every one
// that does says its charges in flight would admit it.
func waitsForCharges(s *scratch) bool {
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

// awaitCharges waits, up to settle_wait, until the store's decisions in s
// (s.store decided them) no longer rest on charges in flight, asking it
// again on each pause. It returns nil with s's last decisions, the store's
// error, or a 499 error if the client leaves first (nothing charged).
func (h *Handler) awaitCharges(r *http.Request, s *scratch) error {
	if s.slot == nil {
		if !h.room.enter() {
			return nil // the room is full: refused now
		}
		s.slot = &h.room.n // given back with the scratch
	}
	c := watchClient(r) // net/http alone misses a client leaving before its body is read
	defer c.stop()
	done := c.done()
	t := timerPool.Get().(*time.Timer)
	settled := h.settled.join()
	defer func() {
		h.settled.leave(settled)
		t.Stop()
		timerPool.Put(t)
	}()
	end := time.Now().Add(h.settleWait)
	for pause := settlePollFirst; ; pause = min(2*pause, settlePollMax) {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		t.Reset(min(pause, left))
		woken := false
		select {
		case <-t.C:
		case <-settled:
			t.Stop()
			woken = true
		case <-done:
			return caddyhttp.Error(statusClientClosed, errChargesAbandoned)
		}
		err := s.store.Take(r.Context(), s.reqs, s.decs)
		if woken {
			h.settled.pass(settled) // the next waiter's turn
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

// leave removes the waiter of ch, handing a wake-up it did not take to the
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
