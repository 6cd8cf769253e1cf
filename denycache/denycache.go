// Package denycache remembers, on one instance, the state a remote store
// (Redis) held for the keys of a request it has just refused, so that a
// client hammering a refused key is answered locally, as the store would
// answer it, instead of costing the store a call per request.
//
// An entry is (zone, key) → the zone's limit, the state the refusal read,
// the store's time of the refusal T and the local instant S its call
// started. A request is answered only when every zone has an entry under
// its limit and Step, run on the entries at a conservative estimate of the
// store's time (T + ⌈1.001 × (now − S)⌉), refuses it; a miss drops the
// request's entries (the store may charge them). So the cache never refuses
// what the store would allow. Why that holds for the five algorithms, how
// penalties, refunds, resets, lost state, races (Token, Arm) and clocks
// are kept out of its way, and its memory bound: docs/redis.md, "The deny
// cache: what it keeps, why it is exact, why it is sound".
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

// MaxLogEntries is the most events of a sliding log state the cache keeps.
const MaxLogEntries = 64

// logsPerEntry bounds the sliding log events a shard holds: this many per
// entry of its capacity.
const logsPerEntry = 8

// shards is the number of shards (a power of two).
const shards = 32

// epoch is the origin of Now.
var epoch = time.Now()

// Now is the cache's clock: monotonic nanoseconds since process start (it
// never steps with the wall clock).
func Now() int64 { return int64(time.Since(epoch)) }

// At is the cache's clock at t (a time.Now reading, whose monotonic clock
// it uses): Now, for a caller that has read the time already.
func At(t time.Time) int64 { return int64(t.Sub(epoch)) }

type id struct {
	zone string
	key  algorithms.Key
}

// entry is what the store said of one zone's key when it refused a request.
type entry struct {
	limit    algorithms.Limit
	state    algorithms.State
	fresh    bool  // the key held no state
	redisNow int64 // the store's time of the decision, Unix ms
	start    int64 // Now() when the store call began
	until    int64 // Now() after which the entry is of no use
}

func (e *entry) logs() int {
	if e.state.Log == nil {
		return 0
	}
	return len(e.state.Log.Entries)
}

const ms = int64(time.Millisecond)

// decide is Step for r at the entry's nominal estimate of the store's time
// (see the package comment), a zone that would allow shown as it stands;
// refuses reports that r is refused by this zone at the conservative
// estimate too (and the zone is enforcing; a refundable zone, only by its
// penalty); writes, that the store would write the zone's state (its
// refusal starts a penalty), which the cache cannot do for it.
func (e *entry) decide(r *algorithms.Request, now int64) (d algorithms.Decision, refuses, writes bool) {
	el := max(now-e.start, 0)
	nominal := e.redisNow + el/ms
	conservative := e.redisNow + (el+el/1000+ms-1)/ms
	d, next, _ := algorithms.StepRequest(e.state, e.fresh, r, nominal)
	switch {
	case d.Allowed:
		d, _, _ = algorithms.Step(e.state, e.fresh, r.Limit, nominal, 0)
	case algorithms.StartsPenalty(e.state, e.fresh, next):
		writes = true
	case r.ReportOnly:
	case r.Refundable:
		// A refund (on any instance) may lift the bucket's refusal, never
		// a penalty's.
		end := e.state.Penalized + r.Limit.Penalty
		refuses = !e.fresh && e.state.Penalized != 0 && r.Limit.Penalty > 0 && conservative < end
	default:
		refuses = d.RetryAfter > time.Duration((conservative-nominal)*ms)
	}
	d.Limit = r.Limit.Capacity()
	return d, refuses, writes
}

type shard struct {
	mu   sync.Mutex
	m    map[id]entry
	logs int      // sliding log events held
	_    [40]byte // keep shards' locks on separate cache lines
}

// Cache is a bounded deny cache. A nil *Cache is a disabled cache: every
// method is a no-op and Decide always misses.
type Cache struct {
	perShard int
	logCap   int          // sliding log events a shard may hold
	live     atomic.Int64 // entries held (expired ones included until dropped)
	gen      atomic.Uint64
	seed     maphash.Seed
	shards   [shards]shard
}

// New returns a cache of at most size entries (rounded up to a multiple of
// the shard count), or nil (disabled) when size ≤ 0. It stores nothing
// until armed (Arm).
func New(size int) *Cache {
	if size <= 0 {
		return nil
	}
	c := &Cache{perShard: (size + shards - 1) / shards, seed: maphash.MakeSeed()}
	c.logCap = c.perShard * logsPerEntry
	for i := range c.shards {
		c.shards[i].m = make(map[id]entry)
	}
	return c
}

// Token is the cache's generation, taken (Cache.Token) before a store call
// begins; Remember stores the call's refusal only if it is still current:
// no Clear or Forget happened in between. The zero Token stores nothing.
type Token uint64

// Token returns the current generation: zero while the cache is not armed.
func (c *Cache) Token() Token {
	if c == nil {
		return 0
	}
	return Token(c.gen.Load())
}

// Arm lets the cache store refusals. The store arms it once it can tell
// that state was lost or reset after this moment (its first successful
// poll).
func (c *Cache) Arm() {
	if c != nil {
		c.gen.CompareAndSwap(0, 1)
	}
}

// Armed reports whether the cache was armed.
func (c *Cache) Armed() bool { return c != nil && c.gen.Load() != 0 }

// bump starts a new generation (an armed cache only: arming is Arm's).
func (c *Cache) bump() {
	for {
		g := c.gen.Load()
		if g == 0 || c.gen.CompareAndSwap(g, g+1) {
			return
		}
	}
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

// drop deletes k's entry e from sh (its lock held).
func (c *Cache) drop(sh *shard, k id, e *entry) {
	sh.logs -= e.logs()
	delete(sh.m, k)
	c.live.Add(-1)
}

// Decide answers reqs, a whole request, from the cache when it can (see the
// package comment): it reports whether it did, with out[i] the decision of
// reqs[i], exactly as the store would have answered at the estimated time
// (nothing charged). now is Now(). When it cannot, out holds nothing of
// use, and the entries of reqs' zones are dropped: the store decides, and
// may charge them.
func (c *Cache) Decide(reqs []algorithms.Request, now int64, out []algorithms.Decision) bool {
	if c == nil {
		return false
	}
	all, refused, writes := true, false, false
	var found uint64 // zones < 64 with an entry
	for i := range reqs {
		r := &reqs[i]
		k := id{zone: r.Zone, key: r.Key}
		sh := c.shard(&k)
		sh.mu.Lock()
		e, ok := sh.m[k]
		if ok && (now >= e.until || e.limit != r.Limit) {
			c.drop(sh, k, &e)
			ok = false
		}
		sh.mu.Unlock()
		if !ok {
			all = false
			continue
		}
		if i < 64 {
			found |= 1 << i
		}
		if all {
			var refuses, w bool
			out[i], refuses, w = e.decide(r, now)
			refused, writes = refused || refuses, writes || w
		}
	}
	if all && refused && !writes {
		return true
	}
	if found != 0 || len(reqs) > 64 {
		for i := range reqs {
			if i < 64 && found&(1<<i) == 0 {
				continue
			}
			c.forget(reqs[i].Zone, reqs[i].Key)
		}
	}
	return false
}

// Snapshot is a zone's stored state as the store read it for a refused
// request.
type Snapshot struct {
	// State is the state; Remember keeps its Log, which the caller must not
	// use afterwards.
	State algorithms.State
	// Fresh reports that the key held no state.
	Fresh bool
	// Known is false when the store did not say (a state too long to send).
	Known bool
}

// Remember records the store's answer to reqs if it refused them (an
// enforcing zone refused): out are its decisions, snaps the zones' stored
// states, redisNow the store's time of the decision (Unix ms), start the
// Now() taken before the store call began and tok the Token taken then.
// Nothing is stored when the cache was cleared since tok was taken, or was
// not armed then. A zone whose state is not known (or is a sliding log too
// long to keep) gets no entry, and loses the one it had.
func (c *Cache) Remember(tok Token, start, redisNow int64, reqs []algorithms.Request, out []algorithms.Decision, snaps []Snapshot) {
	if c == nil || tok == 0 || len(snaps) < len(reqs) || len(out) < len(reqs) {
		return
	}
	// An entry is of use until its zone is back to full, or until every
	// refusing zone would admit the request (a zone with no state is full,
	// yet a request of the same zones needs it).
	var wait time.Duration
	refused := false
	for i := range reqs {
		if !out[i].Allowed && !reqs[i].ReportOnly {
			refused = true
			wait = max(wait, out[i].RetryAfter)
		}
	}
	if !refused {
		return
	}
	for i := range reqs {
		r, sn := &reqs[i], &snaps[i]
		k := id{zone: r.Zone, key: r.Key}
		keep := sn.Known
		var e entry
		if keep {
			e = entry{limit: r.Limit, state: sn.State, fresh: sn.Fresh, redisNow: redisNow, start: start,
				until: start + int64(max(wait, out[i].ResetAfter))}
			if e.fresh {
				e.state = algorithms.State{}
			}
			if lg := e.state.Log; lg != nil {
				n := len(lg.Entries)
				// Step appends past the entries it is given when it
				// admits: with no room left, it appends to a copy, so
				// concurrent lookups never write to the kept entries.
				lg.Entries = lg.Entries[:n:n]
				keep = n <= MaxLogEntries
			}
		}
		sh := c.shard(&k)
		sh.mu.Lock()
		if Token(c.gen.Load()) != tok {
			sh.mu.Unlock()
			return
		}
		old, had := sh.m[k]
		if had {
			c.drop(sh, k, &old)
		}
		if keep && sh.logs+e.logs() <= c.logCap {
			if len(sh.m) >= c.perShard {
				c.evict(sh, start)
			}
			sh.m[k] = e
			sh.logs += e.logs()
			c.live.Add(1)
		}
		sh.mu.Unlock()
	}
}

// evict makes room in a full shard (its lock held): drop the expired
// entries; if none was, drop the one that expires soonest.
func (c *Cache) evict(sh *shard, now int64) {
	dropped := false
	var soonest id
	soonestAt := int64(-1)
	for k, e := range sh.m {
		if now >= e.until {
			c.drop(sh, k, &e)
			dropped = true
			continue
		}
		if soonestAt < 0 || e.until < soonestAt {
			soonest, soonestAt = k, e.until
		}
	}
	if !dropped && soonestAt >= 0 {
		e := sh.m[soonest]
		c.drop(sh, soonest, &e)
	}
}

// forget drops the entry of zone and key, if any.
func (c *Cache) forget(zone string, key algorithms.Key) {
	k := id{zone: zone, key: key}
	sh := c.shard(&k)
	sh.mu.Lock()
	if e, had := sh.m[k]; had {
		c.drop(sh, k, &e)
	}
	sh.mu.Unlock()
}

// Forget drops the entry of zone and key (an admin reset on this
// instance), and keeps a refusal read before it from being stored after
// it.
func (c *Cache) Forget(zone string, key algorithms.Key) {
	if c == nil {
		return
	}
	c.bump()
	c.forget(zone, key)
}

// Clear drops every entry (the store's state may have been lost or reset),
// and keeps a refusal read before it from being stored after it.
func (c *Cache) Clear() {
	if c == nil {
		return
	}
	c.bump()
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n := len(sh.m)
		clear(sh.m)
		sh.logs = 0
		sh.mu.Unlock()
		c.live.Add(int64(-n))
	}
}

// Drop drops the entries of reqs' zones: the store decides reqs whatever
// the cache holds, and may charge them.
func (c *Cache) Drop(reqs []algorithms.Request) {
	if c == nil {
		return
	}
	for i := range reqs {
		c.forget(reqs[i].Zone, reqs[i].Key)
	}
}
