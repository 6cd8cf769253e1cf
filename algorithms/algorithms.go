// Package algorithms is the vocabulary shared by Sluice's handler and its
// stores (Limit, Request, Decision) and the rate limiting algorithms as pure
// step functions: given a key's state, a limit, the current time and a cost,
// they return the decision and the key's next state. They never read a clock
// and never allocate, so a store can run them under its own lock and the
// same vectors can check every implementation.
//
// Time is measured in whole milliseconds everywhere in this package: it is
// the resolution of every Retry-After and reset instant Sluice reports, and it
// keeps all arithmetic in exact integers (a Lua twin running in Redis works
// in doubles, which are exact for integers below 2^53).
//
// This package imports nothing of Sluice's own.
package algorithms

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names a rate limiting algorithm.
type Algorithm uint8

const (
	// TokenBucket refills Capacity tokens continuously at Events per Window;
	// a request costing c passes when at least c tokens are left.
	TokenBucket Algorithm = iota
)

// String returns the algorithm's configuration name.
func (a Algorithm) String() string {
	switch a {
	case TokenBucket:
		return "token_bucket"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the algorithm with the given configuration name. The
// empty name is the default, TokenBucket.
func ParseAlgorithm(name string) (Algorithm, error) {
	switch name {
	case "", "token_bucket":
		return TokenBucket, nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (known: token_bucket)", name)
}

// MaxScaled bounds Capacity×Window (in milliseconds) + Events so that every
// quantity a step function computes is an integer exactly representable as a
// float64 (2^53), the number type of Redis's Lua.
const MaxScaled = 1 << 53

// MaxRefill bounds how long a key may take to go from empty back to full
// (and the window): 100 years, well inside what a time.Duration holds.
const MaxRefill = 100 * 365 * 24 * int64(time.Hour/time.Millisecond)

// Limit is a compiled rate limit: Events per Window, with a bucket of Burst.
type Limit struct {
	// Algorithm decides how events are counted.
	Algorithm Algorithm
	// Events is the number of events (cost units) refilled per Window.
	Events int64
	// Window is the refill period, in milliseconds.
	Window int64
	// Burst is the bucket's capacity; 0 means Events.
	Burst int64
}

// NewLimit builds a Limit from configuration values and checks it.
func NewLimit(alg Algorithm, events int64, window time.Duration, burst int64) (Limit, error) {
	l := Limit{Algorithm: alg, Events: events, Window: window.Milliseconds(), Burst: burst}
	return l, l.Validate()
}

// Capacity is the most a key can ever spend at once.
func (l Limit) Capacity() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Events
}

// Errors returned by Limit.Validate; wrap them with the zone and field.
var (
	ErrEvents  = errors.New("events must be a positive integer")
	ErrWindow  = errors.New("window must be at least 1ms")
	ErrBurst   = errors.New("burst must not be negative")
	ErrTooWide = errors.New("capacity × window (in milliseconds) + events exceeds 2^53; shorten the window or lower the capacity")
	ErrTooMany = errors.New("events must not exceed 2^53")
	ErrTooSlow = errors.New("window, or the time to refill the whole capacity, exceeds 100 years; raise events or lower the burst")
)

// Validate reports whether the limit can be enforced exactly.
func (l Limit) Validate() error {
	switch {
	case l.Events <= 0:
		return ErrEvents
	case l.Window < 1:
		return ErrWindow
	case l.Burst < 0:
		return ErrBurst
	case l.Events > MaxScaled || l.Burst > MaxScaled:
		return ErrTooMany
	case l.Capacity() > (MaxScaled-l.Events)/l.Window:
		// full + rate ≤ 2^53 keeps every intermediate (a refill of up to
		// full, a ceiling division's a+b-1) exact in Lua's doubles.
		return ErrTooWide
	case l.Window > MaxRefill || ceilDiv(l.Capacity()*l.Window, l.Events) > MaxRefill:
		return ErrTooSlow
	}
	return nil
}

// Request asks a store to charge Cost to one key of one zone.
type Request struct {
	// Zone is the zone's name; with Key it names the state.
	Zone string
	// Key is the identity's fixed-size token (see package identity).
	Key Key
	// Limit is the zone's limit, as configured now.
	Limit Limit
	// Cost is what this request spends; at least 1.
	Cost int64
}

// KeySize is the length of a Key.
const KeySize = 18

// Key is a bounded identity token: an opaque fixed-size value that never
// holds a raw credential (package identity builds them).
type Key [KeySize]byte

// Decision is a store's answer for one Request.
type Decision struct {
	// Allowed reports whether the request may pass.
	Allowed bool
	// Limit is the zone's capacity.
	Limit int64
	// Remaining is what the key could still spend right after this decision.
	Remaining int64
	// RetryAfter is, for a refusal, the earliest time from now at which the
	// same request could pass if nobody else spent; 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is the time from now at which the key is back to full.
	ResetAfter time.Duration
}

// State is one key's stored state. For the token bucket, Debt is what the
// key has spent and not yet got back, in tokens scaled by Scale (tokens ×
// Scale, an exact integer), counted at At (Unix milliseconds). Keeping the
// debt rather than the tokens left makes a changed limit apply at once and
// fairly: raising the capacity from 3 to 10 gives a client who spent 3 its 7
// at once; lowering it from 10 to 3 after 4 were spent refuses it.
type State struct {
	Debt  int64
	At    int64
	Scale int64
}

// Step runs one decision of the limit's algorithm. fresh reports that the key
// has no state (never seen, or expired), which every algorithm treats as a
// full allowance. It returns the decision, the state to store, and the Unix
// millisecond at which the state is back to full and may be forgotten.
func Step(st State, fresh bool, l Limit, now, cost int64) (d Decision, next State, fullAt int64) {
	switch l.Algorithm {
	default: // TokenBucket; Validate admits no other.
		return tokenBucket(st, fresh, l, now, cost)
	}
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
