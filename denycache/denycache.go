// Package denycache remembers, on one instance, which keys a remote store
// has just refused and until when, so that a client hammering a refused key
// is answered locally instead of costing the store a call per request.
//
// An entry is (zone, key) → (limit, cost, until): the store refused a
// request of cost c with RetryAfter R at (local) time start, so until =
// start + R − margin. A later request for the same zone and key, with the
// same limit, a cost ≥ c and arriving before until, is refused locally.
//
// # Soundness: it never refuses what the store would have allowed
//
// Common argument. Every algorithm's RetryAfter is exact (package
// algorithms: after waiting exactly RetryAfter the same request passes if
// nobody else spent, and 1ms sooner it does not; a cost above the capacity
// is refused with RetryAfter = Window and never passes). Two facts hold for
// all five algorithms: (a) with nobody spending, a key's state only moves
// toward allowing as time passes (what it can admit never shrinks), and (b)
// spending by anyone (this instance or another) only moves it away from
// allowing, delaying the instant a given cost passes. Moreover, admission is
// monotone in the cost: if cost c is refused at an instant, every cost ≥ c
// is refused at that instant. So for any instant t < until and any cost
// c' ≥ c, the store — whatever else happened meanwhile, short of the
// exceptions below — would refuse c' at t. Per algorithm:
//
//   - token_bucket: the debt (spent and not yet refilled) falls linearly
//     with time and rises only by charges; cost c passes when debt + c ≤
//     capacity. Refused c at time T with RetryAfter R means the debt
//     reaches capacity − c no sooner than T + R with no charges; charges
//     only raise it; c' ≥ c needs a lower debt still.
//   - gcra: the theoretical arrival time (TAT) only moves forward by
//     charges; a request of cost c passes when TAT − now ≤ τ − c·u; with now
//     increasing and TAT fixed or growing, the first passing instant for c
//     is T + R at the earliest, and later for c' ≥ c.
//   - fixed_window: the count of the current aligned window only grows
//     until the window ends (then it restarts at 0); R for a cost that fits
//     the capacity is the end of the window (the count can only fall then),
//     and count + c' > Events whenever count + c > Events.
//   - sliding_window: the estimate prev × (remaining share of the previous
//     window) + cur never grows while nobody spends (package algorithms,
//     sliding_window.go) and grows with every charge; R is the first
//     instant the estimate admits c, in closed form, exact to the ms.
//   - sliding_log: the log's sum over the last Window only loses entries as
//     they age out and gains them by charges; R is when enough of the
//     oldest entries have aged out for c to fit; c' ≥ c needs more to age
//     out.
//
// Exceptions, each handled or bounded:
//
//   - A changed limit (config reload; the cache lives with the store, which
//     survives reloads): an entry records the limit it was refused under;
//     a lookup carrying a different limit (algorithm, events, window or
//     burst) drops the entry and misses. An instance still running the old
//     limit during a rolling reload may keep its denial until `until`.
//   - An admin reset deletes the key in the store: the store's ResetKeys
//     calls Forget on this instance (other instances keep their entries, at
//     most R).
//   - State lost in the store (Redis restarted empty, FLUSHDB): the store
//     calls Clear on every error that counts as a store failure (a restart
//     breaks the pooled connections); a FLUSHDB by an operator goes unseen
//     and its denials last at most R.
//   - Cluster requests spanning slots: a charge later refunded (another
//     slot refused) can cause a refusal the refund then undoes; that is the
//     non-atomic window the store already documents, one round trip long.
//   - Clocks: the store decides with Redis's clock, the cache with this
//     instance's monotonic clock. until is measured from the instant the
//     store call started (the script ran after it, so the true release is
//     later), minus a margin of 1ms (Retry-After's resolution) + R/1000
//     (0.1%, twice the 500ppm NTP slews a clock at most). A local clock
//     running slow by more than that would keep a denial up to the
//     difference longer; running fast releases it early (harmless: the
//     store decides). Redis's wall clock stepping is irrelevant: R is a
//     duration.
//
// Memory is bounded: a fixed number of entries, sharded; a full shard first
// drops its expired entries, then the entry that expires soonest.
package denycache

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// DefaultSize is the default number of entries of a store's deny cache.
const DefaultSize = 10000

// shards is the number of shards (a power of two).
const shards = 32

// epoch is the origin of Now.
var epoch = time.Now()

// Now is the cache's clock: monotonic nanoseconds since process start (it
// never steps with the wall clock).
func Now() int64 { return int64(time.Since(epoch)) }

type id struct {
	zone string
	key  algorithms.Key
}

type entry struct {
	limit     algorithms.Limit
	cost      int64
	until     int64 // Now() before which cost ≥ cost is refused (margin taken)
	retryAt   int64 // start + RetryAfter: what a refusal reports
	reset     int64 // Now() at which the store said the key is back to full
	remaining int64
	others    []Other
}

// Other is what the store said of another zone of the request it refused
// (allowed there, vetoed, nothing charged): a local refusal of the same
// request reports those numbers for that zone, as they were at the
// refusal.
type Other struct {
	Zone      string
	Key       algorithms.Key
	Limit     algorithms.Limit
	Remaining int64
}

type shard struct {
	mu sync.Mutex
	m  map[id]entry
	_  [40]byte // keep shards' locks on separate cache lines
}

// Cache is a bounded deny cache. A nil *Cache is a disabled cache: every
// method is a no-op and Lookup always misses.
type Cache struct {
	perShard int
	live     atomic.Int64 // entries held (expired ones included until dropped)
	seed     maphash.Seed
	shards   [shards]shard
}

// New returns a cache of at most size entries (rounded up to a multiple of
// the shard count), or nil (disabled) when size ≤ 0.
func New(size int) *Cache {
	if size <= 0 {
		return nil
	}
	c := &Cache{perShard: (size + shards - 1) / shards, seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[id]entry)
	}
	return c
}

// Active reports whether the cache may hold an entry: one atomic load, so a
// store with no refusals pays nothing else.
func (c *Cache) Active() bool { return c != nil && c.live.Load() > 0 }

// Len is the number of entries held.
func (c *Cache) Len() int {
	if c == nil {
		return 0
	}
	return int(c.live.Load())
}

// Cap is the most entries the cache holds.
func (c *Cache) Cap() int {
	if c == nil {
		return 0
	}
	return c.perShard * shards
}

func (c *Cache) shard(k *id) *shard {
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.Write(k.key[:])
	_, _ = h.WriteString(k.zone)
	return &c.shards[h.Sum64()&(shards-1)]
}

// Lookup reports whether a request of cost in zone for key under limit l is
// known refused at now, and if so the refusal to report: RetryAfter is the
// store's, counted from the start of the call that refused (so it matches
// what the store would answer, give or take a round trip), rounded up to
// the millisecond; the cache itself releases the key a margin earlier. An entry recorded under another
// limit, or expired, is dropped.
func (c *Cache) Lookup(zone string, key algorithms.Key, l algorithms.Limit, cost, now int64) (algorithms.Decision, bool) {
	d, _, ok := c.LookupOthers(zone, key, l, cost, now)
	return d, ok
}

// LookupOthers is Lookup, also returning what the refusal said of the
// request's other zones (read-only).
func (c *Cache) LookupOthers(zone string, key algorithms.Key, l algorithms.Limit, cost, now int64) (algorithms.Decision, []Other, bool) {
	if c == nil {
		return algorithms.Decision{}, nil, false
	}
	k := id{zone: zone, key: key}
	sh := c.shard(&k)
	sh.mu.Lock()
	e, ok := sh.m[k]
	if !ok {
		sh.mu.Unlock()
		return algorithms.Decision{}, nil, false
	}
	if e.limit != l || now >= e.until {
		delete(sh.m, k)
		sh.mu.Unlock()
		c.live.Add(-1)
		return algorithms.Decision{}, nil, false
	}
	sh.mu.Unlock()
	if cost < e.cost {
		return algorithms.Decision{}, nil, false
	}
	return algorithms.Decision{
		Allowed:    false,
		Limit:      l.Capacity(),
		Remaining:  e.remaining,
		RetryAfter: ceilMs(e.retryAt - now),
		ResetAfter: ceilMs(max(e.reset, e.retryAt) - now),
	}, e.others, true
}

// ceilMs rounds ns up to a whole millisecond, the resolution of every time
// Sluice reports.
func ceilMs(ns int64) time.Duration {
	const ms = int64(time.Millisecond)
	return time.Duration((ns + ms - 1) / ms * ms)
}

// minCache is the shortest RetryAfter worth remembering.
const minCache = 2 * time.Millisecond

// Margin is what is subtracted from a refusal's RetryAfter before it is
// remembered: 1ms (the resolution of RetryAfter) plus 0.1% of it (clock
// rate differences between this instance and the store).
func Margin(r time.Duration) time.Duration { return time.Millisecond + r/1000 }

// Remember records that the store refused a request of cost in zone for key
// under limit l with decision d; start is Now() taken before the store call
// began. Refusals too short to be worth it are ignored.
func (c *Cache) Remember(zone string, key algorithms.Key, l algorithms.Limit, cost, start int64, d algorithms.Decision) {
	c.RememberWith(zone, key, l, cost, start, d, nil)
}

// RememberWith is Remember, also keeping what the store said of the
// request's other zones (others is kept, not copied).
func (c *Cache) RememberWith(zone string, key algorithms.Key, l algorithms.Limit, cost, start int64, d algorithms.Decision, others []Other) {
	if c == nil || d.Allowed || d.RetryAfter < minCache {
		return
	}
	e := entry{others: others, limit: l, cost: cost, until: start + int64(d.RetryAfter-Margin(d.RetryAfter)), retryAt: start + int64(d.RetryAfter),
		reset: start + int64(d.ResetAfter), remaining: max(d.Remaining, 0)}
	k := id{zone: zone, key: key}
	sh := c.shard(&k)
	sh.mu.Lock()
	_, had := sh.m[k]
	if !had && len(sh.m) >= c.perShard {
		c.evict(sh, start)
	}
	sh.m[k] = e
	sh.mu.Unlock()
	if !had {
		c.live.Add(1)
	}
}

// evict makes room in a full shard (its lock held): drop the expired
// entries; if none was, drop the one that expires soonest.
func (c *Cache) evict(sh *shard, now int64) {
	dropped := 0
	var soonest id
	soonestAt := int64(-1)
	for k, e := range sh.m {
		if now >= e.until {
			delete(sh.m, k)
			dropped++
			continue
		}
		if soonestAt < 0 || e.until < soonestAt {
			soonest, soonestAt = k, e.until
		}
	}
	if dropped == 0 && soonestAt >= 0 {
		delete(sh.m, soonest)
		dropped++
	}
	c.live.Add(int64(-dropped))
}

// Forget drops the entry of zone and key (an admin reset).
func (c *Cache) Forget(zone string, key algorithms.Key) {
	if c == nil {
		return
	}
	k := id{zone: zone, key: key}
	sh := c.shard(&k)
	sh.mu.Lock()
	_, had := sh.m[k]
	delete(sh.m, k)
	sh.mu.Unlock()
	if had {
		c.live.Add(-1)
	}
}

// Clear drops every entry (the store's state may have been lost).
func (c *Cache) Clear() {
	if !c.Active() {
		return
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n := len(sh.m)
		clear(sh.m)
		sh.mu.Unlock()
		c.live.Add(int64(-n))
	}
}
