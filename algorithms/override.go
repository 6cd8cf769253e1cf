package algorithms

import (
	"errors"
	"fmt"
)

// Override is one key's limit set at runtime (the admin API) in place of
// its zone's, until Expires: another Events, Window and Burst (the zone's
// algorithm, penalty and delay kept), or Block (every request refused),
// or Unlimited (every request allowed, nothing charged). The key's state
// carries over, as under a changed limit (docs/algorithms.md).
type Override struct {
	// Events, Window (ms) and Burst replace the zone's; Burst 0 means
	// Events. Unset with Block or Unlimited.
	Events, Window, Burst int64
	Block, Unlimited      bool
	// Expires is when the override ends (Unix ms).
	Expires int64
}

// MaxOverrideCapacity bounds an override's events and burst: the Redis
// script returns the overridden capacity in the number that says whether a
// request was allowed (4 × (capacity + 1) + allowed), exact below 2^53.
const MaxOverrideCapacity = 1<<50 - 1

// Errors of Override.Check; the admin API names the field.
var (
	ErrOverrideKind    = errors.New("an override is exactly one of: events and window (burst optional), block, unlimited")
	ErrOverrideExpires = errors.New("expires must be in the future")
	ErrOverrideTooBig  = fmt.Errorf("events and burst of an override must not exceed %d", int64(MaxOverrideCapacity))
	ErrOverrideConc    = errors.New("overrides apply to rate zones, not concurrency zones")
)

// Capacity is the override's bucket, as Limit.Capacity.
func (o *Override) Capacity() int64 {
	if o.Burst > 0 {
		return o.Burst
	}
	return o.Events
}

// Apply returns l with the override's events, window and burst (l itself
// for Block and Unlimited).
func (o *Override) Apply(l Limit) Limit {
	if o.Block || o.Unlimited {
		return l
	}
	l.Events, l.Window, l.Burst = o.Events, o.Window, o.Burst
	return l
}

// Check reports whether o can replace zone limit l at now. The error of an
// override whose limit l's algorithm cannot enforce is Limit.Validate's.
func (o *Override) Check(l Limit, now int64) error {
	if l.Algorithm == Concurrency {
		return ErrOverrideConc
	}
	kinds := 0
	for _, k := range []bool{o.Block, o.Unlimited, o.Events != 0 || o.Window != 0 || o.Burst != 0} {
		if k {
			kinds++
		}
	}
	switch {
	case kinds != 1:
		return ErrOverrideKind
	case o.Expires <= now:
		return ErrOverrideExpires
	case o.Events > MaxOverrideCapacity || o.Burst > MaxOverrideCapacity:
		return ErrOverrideTooBig
	}
	if o.Block || o.Unlimited {
		return nil
	}
	ol := o.Apply(l)
	// A delay_after above the override's capacity counts as the capacity
	// (threshold), as the zone's may not.
	ol.DelayAfter = min(ol.DelayAfter, ol.Capacity())
	return ol.Validate()
}

// StepOverride decides r at now under override o in force (o.Expires >
// now): Block refuses until the override ends and Unlimited allows, both
// charging nothing (write false); otherwise r is decided by StepPending
// under o's limit. The decision's Limit is the overridden capacity (0 for
// Block) and Overridden is set.
func StepOverride(o *Override, st State, fresh bool, r *Request, now, pending int64) (d Decision, next State, fullAt int64, write bool) {
	switch {
	case o.Block:
		left := ms(o.Expires - now)
		d = Decision{RetryAfter: left, ResetAfter: left}
	case o.Unlimited:
		c := min(r.Limit.Capacity(), MaxOverrideCapacity)
		d = Decision{Allowed: true, Limit: c, Remaining: c}
	default:
		or := *r
		or.Limit = o.Apply(r.Limit)
		d, next, fullAt = StepPending(st, fresh, &or, now, pending)
		write = true
	}
	d.Overridden = true
	return d, next, fullAt, write
}

// PeekOverride is Peek under override o in force.
func PeekOverride(o *Override, st State, fresh bool, l Limit, now int64) Decision {
	r := Request{Limit: l}
	if o.Block || o.Unlimited {
		d, _, _, _ := StepOverride(o, st, fresh, &r, now, 0)
		return d
	}
	d := Peek(st, fresh, o.Apply(l), now)
	d.Overridden = true
	return d
}
