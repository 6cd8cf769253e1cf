package algorithms

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Concurrency is not a rate: a concurrency zone limits how many requests
// of one key are in flight at once. Its Limit reads Events as the slots
// (at most Events requests in flight) and Window as the lease in
// milliseconds: how long a shared store (Redis) keeps a slot whose holder
// stopped renewing it, so that an instance that crashes holding slots gives
// them back by itself. A Request of a concurrency zone takes one slot
// (Cost 1) under its Holder id; the store gives the slot back when the
// request ends (the store's Release). Its numeric value travels to the Lua
// twin in Redis (lua/concurrency.lua) and must not change.
//
// ParseAlgorithm does not know it: a zone is a concurrency zone by its
// configuration (`concurrent`), not by `algorithm`.
const Concurrency Algorithm = 5

// numAlgorithms counts the rate algorithms only; Concurrency comes after
// them.
var _ = [1]struct{}{}[numAlgorithms-Concurrency]

// ConcurrencyRetry is a concurrency refusal's RetryAfter (and ResetAfter):
// when a slot frees is not in any state (it is when some request ends), so
// the step hints the smallest Retry-After a response can carry. The handler
// may raise it from the hold times it observes.
const ConcurrencyRetry = time.Second

// Bounds of a concurrency limit.
const (
	// MaxConcurrent bounds Events (the slots): every slot in use is a lease
	// in the key's sorted set in Redis.
	MaxConcurrent = 1_000_000
	// MinLease and MaxLease bound Window (the lease, ms): a lease is
	// renewed at half its length, and shorter than a second would renew
	// more than once a second per request; longer than a day keeps a
	// crashed instance's slots for a day.
	MinLease = int64(time.Second / time.Millisecond)
	MaxLease = int64(24 * time.Hour / time.Millisecond)
)

// Errors of a concurrency limit (Limit.Validate).
var (
	ErrConcurrent = fmt.Errorf("concurrent must be between 1 and %d", MaxConcurrent)
	ErrLease      = errors.New("lease must be between 1s and 24h")
)

// NewConcurrencyLimit builds the Limit of a concurrency zone of n slots with
// the given lease, and checks it.
func NewConcurrencyLimit(n int64, lease time.Duration) (Limit, error) {
	l := Limit{Algorithm: Concurrency, Events: n, Window: lease.Milliseconds()}
	return l, l.Validate()
}

// validateConcurrency checks a concurrency limit (Validate's case).
func (l Limit) validateConcurrency() error {
	switch {
	case l.Events < 1 || l.Events > MaxConcurrent:
		return ErrConcurrent
	case l.Window < MinLease || l.Window > MaxLease:
		return ErrLease
	case l.Burst != 0:
		return fmt.Errorf("concurrency: %w", ErrBurstNotAllowed)
	case l.Penalty != 0:
		return fmt.Errorf("concurrency: %w", ErrPenalty)
	case l.Delay != 0 || l.DelayAfter != 0:
		return fmt.Errorf("concurrency: %w", ErrDelayNotAllowed)
	}
	return nil
}

// concurrency is the concurrency zone's step function. State.Debt is the
// number of slots in use (a shared store drops expired leases before it
// counts); a request costing c (1: one slot) passes when the slots in use
// plus c are at most Events, and cost 0 is the key's view. A refusal's
// RetryAfter and ResetAfter are ConcurrencyRetry; an allowed decision's
// ResetAfter is 0. fullAt is now once no slot is in use, else never
// (math.MaxInt64), so that a memory store never sweeps or evicts a slot a
// request still holds. Changed limits: docs/algorithms.md.
func concurrency(st State, fresh bool, l Limit, now, cost int64) (Decision, State, int64) {
	n := l.Events
	used := int64(0)
	if !fresh {
		used = max(st.Debt, 0)
	}
	d := Decision{Allowed: true, Limit: n}
	switch {
	case cost == 0:
	case cost <= n-used:
		used += cost
	default:
		d.Allowed = false
		d.RetryAfter, d.ResetAfter = ConcurrencyRetry, ConcurrencyRetry
	}
	d.Remaining = max(n-used, 0)
	fullAt := now
	if used > 0 {
		fullAt = math.MaxInt64
	}
	return d, State{Alg: Concurrency, Debt: used}, fullAt
}
