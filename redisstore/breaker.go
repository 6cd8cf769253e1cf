package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// ErrCircuitOpen is returned (wrapped: match it with errors.Is) by Take
// while the circuit breaker is open or half-open with its probe in flight:
// Redis is not called, and each zone's fail policy applies at once.
var ErrCircuitOpen = errors.New("redis circuit breaker open")

// Breaker defaults. A probe costs one request per instance per cool-down
// (at most the timeout), so the cap is kept short: decisions resume at most
// DefaultMaxCooldown (+ the timeout) after Redis is back.
const (
	DefaultBreakerFailures = 5
	DefaultCooldown        = time.Second
	DefaultMaxCooldown     = 5 * time.Second
)

// Circuit states, as exported by the caddy_rate_limit_circuit_state gauge.
const (
	circuitClosed   int32 = 0
	circuitHalfOpen int32 = 1
	circuitOpen     int32 = 2
)

var stateNames = [...]string{"closed", "half-open", "open"}

// circuitError is what Take returns while the circuit is open: it names the
// failure that opened it. One value per opening, so failing fast allocates
// nothing.
type circuitError struct {
	msg string
	b   *breaker
}

func (e *circuitError) Error() string        { return e.msg }
func (e *circuitError) Is(target error) bool { return target == ErrCircuitOpen }

// RetryIn implements stores.RetryHinter: the time left until the breaker
// lets a probe through (0 once it does).
func (e *circuitError) RetryIn() time.Duration {
	return time.Duration(max(e.b.until.Load()-monoNow(), 0))
}

// StoreErrorKind: see storeError.
func (e *circuitError) StoreErrorKind() string { return "circuit_open" }

// breaker is a small circuit breaker, written for this hot path (the
// policy: docs/redis.md, "Circuit breaker"; what counts: counts). Closed
// costs one atomic load before a call and, after a success, one more (a
// store only when a failure run was in progress). The transitions take a
// mutex; they are rare. Preferred to github.com/sony/gobreaker/v2, whose
// every call takes a mutex and reads the clock (docs/performance.md).
type breaker struct {
	threshold     int32
	base, ceiling time.Duration

	state   atomic.Int32
	fails   atomic.Int32 // consecutive counted failures while closed
	until   atomic.Int64 // monoNow() at which an open circuit may probe
	probing atomic.Bool  // a half-open probe is in flight
	err     atomic.Pointer[circuitError]
	fast    atomic.Int64 // calls failed fast
	opens   atomic.Int64 // times opened from closed (outages)
	fastCtr prometheus.Counter

	mu       sync.Mutex
	cooldown time.Duration // current cool-down (doubles on a failed probe)
	openedAt time.Time     // start of the current outage
	kick     bool          // probeNow during a probe: its failure waits no cool-down

	// onChange is called (outside the lock) on every state change.
	onChange func(from, to int32, cause error, cooldown, outage time.Duration, fast int64)
}

var monoEpoch = time.Now()

func monoNow() int64 { return int64(time.Since(monoEpoch)) }

// newBreaker returns a breaker, or nil (disabled) when failures ≤ 0.
func newBreaker(failures int, cooldown, ceiling time.Duration) *breaker {
	if failures <= 0 {
		return nil
	}
	return &breaker{threshold: int32(failures), base: cooldown, ceiling: max(ceiling, cooldown), cooldown: cooldown}
}

// allow is called before a store call. It returns probe = true for the one
// call let through a half-open circuit, or an error (ErrCircuitOpen) to
// return instead of calling Redis.
func (b *breaker) allow() (probe bool, err error) {
	if b == nil || b.state.Load() == circuitClosed {
		return false, nil
	}
	if monoNow() < b.until.Load() || !b.probing.CompareAndSwap(false, true) {
		b.fast.Add(1)
		if b.fastCtr != nil {
			b.fastCtr.Inc()
		}
		return false, b.err.Load()
	}
	b.transition(circuitHalfOpen, nil)
	return true, nil
}

// done reports a call's outcome: failed says it failed in a way that counts
// (see counts); abandoned that the caller went away before Redis answered,
// which says nothing about Redis.
func (b *breaker) done(probe, failed, abandoned bool, cause error) {
	if b == nil {
		return
	}
	switch {
	case abandoned:
		if probe {
			b.probing.Store(false) // let another call probe
		}
	case failed && probe:
		b.open(cause, true)
	case failed:
		if b.fails.Add(1) >= b.threshold && b.state.Load() == circuitClosed {
			b.open(cause, false)
		}
	case probe:
		b.transition(circuitClosed, nil)
	default:
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
	}
}

// open opens the circuit: from closed after a run of failures, or again
// after a failed probe (doubling the cool-down up to the ceiling).
func (b *breaker) open(cause error, reopen bool) {
	b.mu.Lock()
	if !reopen && b.state.Load() != circuitClosed {
		b.mu.Unlock()
		return
	}
	if reopen {
		b.cooldown = min(2*b.cooldown, b.ceiling)
	} else {
		b.cooldown = b.base
		b.openedAt = time.Now()
		b.opens.Add(1)
	}
	b.err.Store(&circuitError{msg: "redis circuit breaker open (Redis not called for " + b.cooldown.String() + "): " + cause.Error(), b: b})
	// until before state: a reader that sees open must see the new until.
	until := monoNow() + int64(b.cooldown)
	if reopen && b.kick {
		// The probe was on its way to the server that was replaced.
		until, b.kick = monoNow(), false
	}
	b.until.Store(until)
	from := b.state.Swap(circuitOpen)
	b.probing.Store(false)
	cd, outage, fast := b.cooldown, time.Since(b.openedAt), b.fast.Load()
	b.mu.Unlock()
	if from != circuitOpen && b.onChange != nil {
		b.onChange(from, circuitOpen, cause, cd, outage, fast)
	}
}

// failsFast reports whether allow would fail a call at once now (open,
// within its cool-down).
func (b *breaker) failsFast() bool {
	return b != nil && b.state.Load() == circuitOpen && monoNow() < b.until.Load()
}

// probeNow ends an open circuit's cool-down, so that the next call probes:
// the store learnt that another server took the node's place (a Sentinel
// promotion, a Cluster slot map showing a new master), which the cool-down
// would otherwise hide for up to max_cooldown. A probe in flight, likely
// sent to the server replaced, is followed at once by another if it fails.
func (b *breaker) probeNow() {
	if b == nil {
		return
	}
	b.mu.Lock()
	switch b.state.Load() {
	case circuitOpen:
		b.until.Store(monoNow())
	case circuitHalfOpen:
		b.kick = true
	}
	b.mu.Unlock()
}

// transition moves to half-open or closed.
func (b *breaker) transition(to int32, cause error) {
	b.mu.Lock()
	from := b.state.Swap(to)
	if to == circuitClosed {
		b.fails.Store(0)
		b.cooldown = b.base
		b.probing.Store(false)
		b.kick = false
	}
	outage, fast := time.Since(b.openedAt), b.fast.Load()
	b.mu.Unlock()
	if from != to && b.onChange != nil {
		b.onChange(from, to, cause, b.base, outage, fast)
	}
}

// State is the breaker's state (closed, half-open or open).
func (b *breaker) State() string {
	if b == nil {
		return "disabled"
	}
	return stateNames[b.state.Load()]
}

// counts reports whether an error from Redis counts toward opening the
// circuit: the failures that cost time or say the server cannot take
// writes — timeouts, connection errors (refused, reset, EOF, pool timeout,
// a closed client), and the replies READONLY (a replica after a failover),
// NOREPLICAS (a master short of the replicas min-replicas-to-write asks
// for), OOM, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN and BUSY. Not counted:
// errors about one key or the script (WRONGTYPE, ERR …, a malformed reply),
// which cost no time and which a breaker would not cure; they still go to
// the zones' fail policy.
func counts(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne), errors.As(err, new(*tlsError)),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed):
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range []string{"READONLY", "NOREPLICAS", "OOM", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}

// storeError is the error of a decision that Redis did not give (Take).
// Its StoreErrorKind names the failure for the handler's
// caddy_rate_limit_store_errors_total{kind}, from a bounded set: timeout,
// connection, tls (a failed handshake: tls.go), readonly, noreplicas, oom,
// noscript, noperm (perm.go), other; and circuit_open, an open
// breaker's (circuitError, returned as it is: failing fast allocates
// nothing).
type storeError struct{ err error }

func (e *storeError) Error() string { return e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

func (e *storeError) StoreErrorKind() string {
	var ne net.Error
	switch {
	case errors.As(e.err, new(*tlsError)):
		return "tls"
	case errors.Is(e.err, context.DeadlineExceeded), errors.As(e.err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(e.err, new(*net.OpError)):
		return "connection"
	}
	if errors.As(e.err, new(*permError)) {
		return "noperm"
	}
	msg := e.err.Error()
	switch {
	case strings.HasPrefix(msg, "READONLY"):
		return "readonly"
	case strings.HasPrefix(msg, "NOREPLICAS"):
		return "noreplicas"
	case strings.HasPrefix(msg, "OOM"):
		return "oom"
	case strings.HasPrefix(msg, "NOSCRIPT"):
		return "noscript"
	}
	return "other"
}
