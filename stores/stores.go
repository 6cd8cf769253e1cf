// Package stores is the contract between the rate_limit handler and its
// state stores (the guest modules of the http.handlers.rate_limit.stores
// namespace): the Store interface, the capabilities a store may add to it,
// and Layer, the shape of whatever wraps a store's Take.
//
// A store asserts each capability it has at compile time
// (var _ stores.Refunder = (*Store)(nil)); the handler asks for one with a
// type assertion at Provision. Stores import this package and algorithms,
// never the handler's.
package stores

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Store decides rate limits: the one capability every store has.
//
// Take decides every zone of one request in one call: if every request is
// allowed, all are charged; if any is refused, none is charged. A refusal
// never consumes. It writes one decision per request into out, which the
// caller sizes to len(reqs) (an out parameter, not a returned slice, so the
// hot path allocates nothing). An error means the store could not decide;
// out is then meaningless, except for an *algorithms.PartialError: the
// zones it does not mark failed (all FailApart) were decided and charged.
type Store interface {
	Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error
}

// Keyed is a store whose configuration has an identity: two handlers whose
// stores report the same key share state (one zone name, one limit).
type Keyed interface {
	Key() string
}

// Refunder gives charges back: a zone with count needs it, and delay
// cancels a waiter's charge with it. Refund must not block the response on
// the network (a remote store queues it).
type Refunder interface {
	Refund(ctx context.Context, refunds []algorithms.Refund) error
}

// Settler settles charges to the amounts their responses reported: a
// zone with settle needs it. Settle is Refund whose refunds may carry
// Settle (algorithms.Settle: the difference given back, or charged on top,
// which may leave a key in debt), so that one request's give-back stays
// one call. It must not block the response on the network.
type Settler interface {
	Settle(ctx context.Context, refunds []algorithms.Refund) error
}

// Pinner is a store that a reload replacing it keeps open while requests
// pin it: Pin when a request may still call it after the response
// (charges in flight, their refunds, waiters), Unpin when it no longer
// will.
type Pinner interface {
	Pin()
	Unpin()
}

// Releaser holds concurrency slots: Release gives back the slots Take
// granted to the concurrency zones of reqs (by holder id) and ignores the
// other zones. It must not block the response on the network: a remote
// store queues the release and retries it, or leaves the slot to its
// lease's expiry.
type Releaser interface {
	Release(ctx context.Context, reqs []algorithms.Request) error
}

// SlotHeir counts the slots other stores of the process hold in zones (a
// reload that changes a memory store's settings makes a new store while
// the requests still running hold their slots in the old one).
type SlotHeir interface {
	InheritSlots(zones []string)
}

// Allowancer serves a zone from a local allowance: units of the shared
// limit granted to this instance, spent here without a round trip.
// LocalAllowance is called at Provision for each zone with one, with the
// largest grant (maxGrant units) and how long unspent units are kept; the
// returned release is called at Cleanup.
type Allowancer interface {
	LocalAllowance(zone string, l algorithms.Limit, maxGrant int64, expiry time.Duration) (release func(), err error)
}

// Admin is a store whose keys the admin API can read and reset.
type Admin interface {
	// PeekKeys writes each key's view (algorithms.Peek) to out and whether
	// it holds state to found, charging nothing.
	PeekKeys(ctx context.Context, zone string, keys []algorithms.Key, l algorithms.Limit, out []algorithms.Decision, found []bool) error
	// ResetKeys deletes the keys' state and returns how many held some.
	ResetKeys(ctx context.Context, zone string, keys []algorithms.Key) (int, error)
}

// Described describes itself, without secrets, for the admin API's zone
// listing.
type Described interface {
	AdminInfo() map[string]any
}

// ErrorKind is implemented by the errors a store returns: the kind
// ("timeout", "circuit_open", ...) labels the handler's store error metric.
type ErrorKind interface {
	StoreErrorKind() string
}

// RetryHinter is implemented by an error that knows when the store may
// answer again (an open circuit breaker: the end of its cool-down). A
// fail-closed refusal tells the client that wait (Retry-After, gRPC's
// pushback); zero or less means unknown.
type RetryHinter interface {
	RetryIn() time.Duration
}

// Syncer decides zones asynchronously (a zone's sync): each instance
// decides a key from its state as last read plus its own charges since,
// without a call to the store, and sends its charges every interval.
// SyncZone is called at Provision for each zone in the mode, with its
// limit, interval and the most keys one instance keeps; the returned
// release is called at Cleanup. SyncStatus reports the mode for a zone's
// admin view (false: the zone is not in it).
type Syncer interface {
	SyncZone(zone string, l algorithms.Limit, interval time.Duration, maxKeys int) (release func(), err error)
	SyncStatus(zone string) (SyncStatus, bool)
}

// SyncStatus is a zone's asynchronous mode as one instance runs it.
type SyncStatus struct {
	// Interval is how often the instance syncs (the shortest of its
	// store's zones' intervals).
	Interval time.Duration
	// Keys is the zone's keys the instance keeps; MaxKeys bounds them.
	Keys, MaxKeys int
	// LastSync is when the last successful sync started (zero: none yet);
	// Failures counts the syncs failed since.
	LastSync time.Time
	Failures int64
	// Held is the units charged here that the store has not confirmed
	// (to send, or sent and unanswered); Dropped the units dropped unsent
	// (a key dropped for MaxKeys while it held some).
	Held, Dropped int64
	// Error is the last failed sync's error ("" after a success).
	Error string
}

// Overrider keeps overrides: a key's limit set at runtime through the admin
// API (algorithms.Override), applied by the store's own Take (Redis: read
// by the decision's script call; memory: this instance's). Each zone holds
// at most a given number; an override ends at its expiry, by the store.
type Overrider interface {
	// SetOverride stores e (replacing the key's override, if any). It
	// fails with ErrTooManyOverrides when the zone holds max others.
	SetOverride(ctx context.Context, zone string, e OverrideEntry, max int) error
	// DeleteOverride removes the key's override and returns it (false:
	// there was none).
	DeleteOverride(ctx context.Context, zone string, key algorithms.Key) (OverrideEntry, bool, error)
	// Overrides returns the zone's overrides in force, and removes those
	// that ended since the last call and returns them (expired): each is
	// returned as expired to one caller only, which logs it.
	Overrides(ctx context.Context, zone string) (live, expired []OverrideEntry, err error)
	// ExpireOverrides is Overrides without the listing: the count in
	// force, and those that ended, handed out as Overrides does.
	ExpireOverrides(ctx context.Context, zone string) (inForce int, expired []OverrideEntry, err error)
	// PeekOverrides writes each key's override in force to out (nil:
	// none), for the admin view of a key.
	PeekOverrides(ctx context.Context, zone string, keys []algorithms.Key, out []*OverrideEntry) error
}

// OverrideEntry is one key's override and its audit: the key's token (and
// the raw key, when the admin request named one), the reason given, who
// set it (the admin request's remote address) and when (Unix ms).
type OverrideEntry struct {
	Key algorithms.Key `json:"-"`
	algorithms.Override
	Reason string `json:"reason"`
	By     string `json:"by"`
	At     int64  `json:"at"`
}

// ErrTooManyOverrides: a zone holds its most overrides.
var ErrTooManyOverrides = errors.New("the zone holds its most overrides (max_overrides)")
