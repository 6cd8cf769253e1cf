// Package algorithms is the vocabulary shared by Sluice's handler and its
// stores (Limit, Request, Decision) and the rate limiting algorithms as pure
// step functions: given a key's state, a limit, the current time and a cost,
// they return the decision and the key's next state. They never read a clock
// and never allocate (the sliding log excepted: it appends to its key's
// log), so a store can run them under its own lock and the same vectors
// (testdata/*.json, loaded by package vectortest) can check every
// implementation: Step, the memory store, and the Lua twin in Redis.
//
// Time is in whole milliseconds throughout, and every quantity an exact
// integer (below 2^53, so that the Lua twins' doubles are exact too). The
// contract every algorithm keeps, and how each decides, precision and
// changed limits included: docs/algorithms.md. This package imports nothing
// of Sluice's own.
package algorithms

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names a rate limiting algorithm.
type Algorithm uint8

// The algorithms. Their numeric values travel to the Lua twins in Redis (as
// package redisstore's script arguments) and must not change.
const (
	// TokenBucket refills Capacity tokens continuously at Events per Window;
	// a request costing c passes when at least c tokens are left.
	TokenBucket Algorithm = iota
	// GCRA is the generic cell rate algorithm: the token bucket's admission
	// behaviour (capacity Burst, or Events; rate Events per Window) kept as
	// one instant, the theoretical arrival time.
	GCRA
	// SlidingWindow is the sliding window counter: the previous and the
	// current aligned window's counts, the previous one weighted by how much
	// of it the sliding window still covers. No burst.
	SlidingWindow
	// FixedWindow counts events in windows aligned to multiples of Window
	// since the Unix epoch; at most Events per window. No burst.
	FixedWindow
	// SlidingLog keeps every admitted event (time, cost) of the last Window:
	// at most Events in any window of that length, exactly. No burst; Events
	// is bounded by MaxLogEvents.
	SlidingLog

	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{
	TokenBucket:   "token_bucket",
	GCRA:          "gcra",
	SlidingWindow: "sliding_window",
	FixedWindow:   "fixed_window",
	SlidingLog:    "sliding_log",
}

// String returns the algorithm's configuration name.
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	if a == Concurrency {
		return "concurrency"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the algorithm with the given configuration name. The
// empty name is the default, TokenBucket.
func ParseAlgorithm(name string) (Algorithm, error) {
	if name == "" {
		return TokenBucket, nil
	}
	for a, n := range algorithmNames {
		if n == name {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (known: token_bucket, gcra, sliding_window, fixed_window, sliding_log)", name)
}

// AllowsBurst reports whether the algorithm has a capacity distinct from
// Events (a burst): the token bucket and GCRA.
func (a Algorithm) AllowsBurst() bool { return a == TokenBucket || a == GCRA }

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
	// Penalty, in milliseconds, is how long a key stays refused once this
	// limit refuses it (penalty.go); 0: no penalty.
	Penalty int64
	// Delay, in milliseconds, is the longest a request may wait for its
	// turn instead of being refused (delay.go: token_bucket and gcra); 0:
	// no waiting. DelayAfter is how many tokens of a burst pass at once
	// when waiting is on (0: the capacity).
	Delay, DelayAfter int64
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

// MaxLogEvents bounds Events for the sliding log: its memory per key is
// one entry per admitted request still in the window, at most Events.
const MaxLogEvents = 10_000

// MaxGCRAUnit bounds GCRA's time unit: GCRA counts time in 1/u ms, u =
// Events / gcd(Events, Window), so that the emission interval Window/Events
// is a whole number of units; rescaling a stored fraction on a changed limit
// multiplies two such u, which must stay below 2^53.
const MaxGCRAUnit = 1 << 26

// Errors returned by Limit.Validate; wrap them with the zone and field.
var (
	ErrEvents    = errors.New("events must be a positive integer")
	ErrWindow    = errors.New("window must be at least 1ms")
	ErrBurst     = errors.New("burst must not be negative")
	ErrTooWide   = errors.New("capacity × window (in milliseconds) + events exceeds 2^53; shorten the window or lower the capacity")
	ErrTooMany   = errors.New("events must not exceed 2^53")
	ErrTooSlow   = errors.New("window, or the time to refill the whole capacity, exceeds 100 years; raise events or lower the burst")
	ErrAlgorithm = errors.New("unknown algorithm")
	// ErrBurstNotAllowed: fixed_window, sliding_window and sliding_log admit
	// at most events per window; they have no separate capacity.
	ErrBurstNotAllowed = errors.New("burst is not allowed with this algorithm: it admits at most events per window (remove burst, or use token_bucket or gcra)")
	// ErrLogTooLong: the sliding log keeps one entry per admitted event.
	ErrLogTooLong = fmt.Errorf("events must not exceed %d with sliding_log: it stores every admitted event of the window (use sliding_window for larger limits)", MaxLogEvents)
	// ErrGCRAUnit: see MaxGCRAUnit.
	ErrGCRAUnit = fmt.Errorf("with gcra, events / gcd(events, window in ms) must not exceed %d (choose a window that shares factors with events, or use token_bucket: same behaviour)", MaxGCRAUnit)
	// ErrPenalty: see Limit.Penalty.
	ErrPenalty = errors.New("penalty must be between 1ms and 100 years (0: none)")
	// ErrDelay: see Limit.Delay.
	ErrDelay = errors.New("delay must be at least 1ms, and events × delay (in ms) + capacity × window (in ms) + events at most 2^53")
	// ErrDelayNotAllowed: a request waits for a bucket's refill.
	ErrDelayNotAllowed = errors.New("delay is only for token_bucket and gcra (a request waits for its bucket's refill)")
	// ErrDelayAfter: see Limit.DelayAfter.
	ErrDelayAfter = errors.New("delay_after must be between 1 and the capacity, and needs delay")
)

// Validate reports whether the limit can be enforced exactly. Errors name
// the field at fault and the algorithm when it matters.
func (l Limit) Validate() error {
	switch {
	case l.Algorithm == Concurrency:
		return l.validateConcurrency()
	case l.Algorithm >= numAlgorithms:
		return ErrAlgorithm
	case l.Events <= 0:
		return ErrEvents
	case l.Window < 1:
		return ErrWindow
	case l.Burst < 0:
		return ErrBurst
	case l.Burst > 0 && !l.Algorithm.AllowsBurst():
		return fmt.Errorf("%s: %w", l.Algorithm, ErrBurstNotAllowed)
	case l.Events > MaxScaled || l.Burst > MaxScaled:
		return ErrTooMany
	case l.Penalty < 0 || l.Penalty > MaxRefill:
		return ErrPenalty
	case l.Delay < 0 || l.Delay > MaxRefill:
		return ErrDelay
	case l.Delay > 0 && !l.Algorithm.AllowsBurst():
		return fmt.Errorf("%s: %w", l.Algorithm, ErrDelayNotAllowed)
	case l.DelayAfter < 0 || l.DelayAfter > 0 && (l.Delay == 0 || l.DelayAfter > l.Capacity()):
		return ErrDelayAfter
	}
	switch l.Algorithm {
	case TokenBucket, GCRA, SlidingWindow:
		// full + rate ≤ 2^53 keeps every intermediate (a refill of up to
		// full, a ceiling division's a+b-1, the sliding window's weighted
		// count) exact in Lua's doubles.
		if l.Capacity() > (MaxScaled-l.Events)/l.Window {
			return ErrTooWide
		}
		if l.Delay > 0 && l.Delay > (MaxScaled-l.Events-l.Capacity()*l.Window)/l.Events {
			return ErrDelay // the waiting room, in the bucket's units, must stay exact too
		}
		if l.Window > MaxRefill {
			return ErrTooSlow
		}
		if l.Algorithm != SlidingWindow && ceilDiv(l.Capacity()*l.Window, l.Events) > MaxRefill {
			return ErrTooSlow
		}
		if l.Algorithm == GCRA && l.Events/gcd(l.Events, l.Window) > MaxGCRAUnit {
			return fmt.Errorf("%s: %w", l.Algorithm, ErrGCRAUnit)
		}
	case FixedWindow:
		// count + cost ≤ 2 × events stays exact.
		if l.Events > MaxScaled/2 {
			return ErrTooMany
		}
	case SlidingLog:
		if l.Events > MaxLogEvents {
			return fmt.Errorf("%s: %w", l.Algorithm, ErrLogTooLong)
		}
	}
	if l.Window > MaxRefill {
		return ErrTooSlow
	}
	return nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Request asks a store to charge Cost to one key of one zone.
type Request struct {
	// Zone is the zone's name; with Key it names the state.
	Zone string
	// Key is the identity's fixed-size token.
	Key Key
	// Limit is the zone's limit, as configured now.
	Limit Limit
	// Cost is what this request spends; at least 1.
	Cost int64
	// ReportOnly marks a zone that decides and records but never vetoes:
	// it is charged only when the whole request passes and it allows
	// itself, exactly as it would be under enforcement.
	ReportOnly bool
	// Refundable marks a charge that may be given back (a zone that counts
	// only some response statuses): the store sets the Decision's At, which
	// the Refund passes back.
	Refundable bool
	// NoDelay forbids waiting for this request (its directive's waiting
	// room is full): a zone with a Delay decides as without one, its
	// reservations kept (delay.go).
	NoDelay bool
	// InFlight marks a charge that stays in flight until the response's
	// status settles it (a zone that counts only some statuses): the
	// store counts it in the key's charges in flight until a Refund with
	// InFlight set (inflight.go). Implies Refundable.
	InFlight bool
	// FailApart marks a zone whose store failure may be handled apart from
	// the request's other zones (its fail policy passes it, or decides it in
	// this instance's memory, alone): a store that decides a request in
	// parts (Redis Cluster, a part per shard) may then decide the other
	// zones without it (PartialError).
	FailApart bool
	// Holder is the holder id of the slot this request takes in a
	// concurrency zone (never 0): the store records it when it admits the
	// request, renews it while the request runs (Redis) and removes it
	// when the request ends (the store's Release). 0 in a rate zone.
	Holder uint64
}

// Leaves reports whether r leaves something with the store that decides
// it, to be given back there later: a charge that may be refunded or
// settled (Refundable, InFlight) or a concurrency slot to release.
func (r *Request) Leaves() bool {
	return r.Refundable || r.InFlight || r.Limit.Algorithm == Concurrency
}

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
	// At is the store's clock (Unix ms) when it decided: set for a
	// Refundable request (a store may set it for any); a Refund of this
	// charge passes it back.
	At int64
	// Delay is, for a request allowed by a zone with a Limit.Delay, how
	// long it must wait for its turn (its slot is reserved: delay.go); 0:
	// now.
	Delay time.Duration
	// InFlight is, for a refusal of an InFlight request, that the key's
	// charges in flight, given back, would admit it (inflight.go): it
	// started no penalty, and the same request may pass once they settle.
	InFlight bool
	// Overridden: the key's Override decided, and Limit is its capacity
	// (override.go).
	Overridden bool
}

// State is one key's stored state. Alg says which algorithm wrote it; a
// state written by another algorithm (the zone's algorithm was changed)
// counts as none. The numeric fields mean, per algorithm:
//
//   - token bucket: Debt is what the key has spent and not yet got back, in
//     tokens × Scale (an exact integer), counted at At (Unix ms).
//   - gcra: the theoretical arrival time At + Debt/Scale ms.
//   - fixed_window: Debt events counted in the window [At, At+Scale).
//   - sliding_window: Debt events in the current aligned window [At,
//     At+Scale), Prev in the one before.
//   - sliding_log: Log, the admitted events of the last window.
//
// Penalized is when the key's penalty started (Unix ms, penalty.go), 0 for
// none; a state may hold a penalty and nothing else (Scale 0, no Log).
// State is stored by value; only the sliding log points to memory.
type State struct {
	Debt  int64
	At    int64
	Scale int64
	Prev  int64
	Log   *Log
	Alg   Algorithm
	// Penalized is when the key's penalty started; see above.
	Penalized int64
}

// Log is the sliding log's state: admitted events, oldest first.
//
// Step never writes to the entries of the Log it is given (within their
// length); a Log it returns may share their backing array and append past
// them. So a caller may keep one state derived from a given state, or
// discard them all, but must not keep two (memstore keeps the committed
// one).
type Log struct {
	Entries []LogEntry
}

// LogEntry is one admitted event of a sliding log.
type LogEntry struct {
	At   int64 // Unix ms
	Cost int64
}

// step runs one decision of the limit's algorithm, without the penalty
// (Step, penalty.go, adds it). fresh reports that the key has no state
// (never seen, or expired), which every algorithm treats as a full
// allowance. It returns the decision, the state to store, and the Unix
// millisecond at which the state is back to full and may be forgotten.
//
// Every algorithm obeys the same contract: a refusal never consumes (the
// state returned with a refusal is the given state, advanced to now); a cost
// above the capacity is refused with RetryAfter = Window; cost 0 returns the
// key's view without charging. step never allocates, except for the sliding
// log (a new Log header, and its entries' growth). The state it returns
// never holds a penalty (Penalized 0).
//
// mayWait says whether the request may wait for its turn, in a zone with a
// Delay (delay.go); only token_bucket and gcra read it.
func step(st State, fresh bool, l Limit, now, cost int64, mayWait bool) (d Decision, next State, fullAt int64) {
	if !fresh && st.Alg != l.Algorithm {
		fresh = true // written by another algorithm: start afresh
	}
	switch l.Algorithm {
	case Concurrency:
		return concurrency(st, fresh, l, now, cost)
	case GCRA:
		return gcra(st, fresh, l, now, cost, mayWait)
	case SlidingWindow:
		return slidingWindow(st, fresh, l, now, cost)
	case FixedWindow:
		return fixedWindow(st, fresh, l, now, cost)
	case SlidingLog:
		return slidingLog(st, fresh, l, now, cost)
	default: // TokenBucket; Validate admits no other.
		return tokenBucket(st, fresh, l, now, cost, mayWait)
	}
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
