// Package memstore is Sluice's embedded store: rate limit state in this
// process's memory, in a sharded map safe under heavy concurrency, bounded in
// the number of keys it holds, with expired keys swept in the background.
//
// It satisfies the store contract of package sluice structurally (it never
// imports it): Take decides every zone of one request at once, and either
// every zone allows and all are charged, or nothing is charged.
package memstore

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// numShards is the number of independently locked parts of the map.
const numShards = 64

// evictionSample is how many keys a full shard looks at to pick a victim.
const evictionSample = 8

// Defaults.
const (
	DefaultMaxKeys       = 1_000_000
	DefaultSweepInterval = time.Minute
	// MinSweepInterval is the shortest sweep interval a configuration may
	// ask for: a sweep walks every shard, and one much more often than a
	// second keeps a core busy for nothing (keys are back to full after a
	// window, rarely sooner).
	MinSweepInterval = time.Second
	// MaxMaxKeys bounds max_keys: about 150 GB of keys, more than one
	// process should hold.
	MaxMaxKeys = 1_000_000_000
)

// Config configures a Store.
type Config struct {
	// MaxKeys bounds the keys held (spread evenly across shards); 0 means
	// DefaultMaxKeys.
	MaxKeys int
	// SweepInterval is how often keys back to full are dropped; 0 means
	// DefaultSweepInterval, negative disables the sweeper (tests).
	SweepInterval time.Duration
	// Now returns the current time in Unix milliseconds; nil means the
	// system clock. Tests inject a fake clock here.
	Now func() int64
}

// Store holds rate limit state in memory.
type Store struct {
	shards   [numShards]shard
	zones    zoneIndex
	seed     maphash.Seed
	now      func() int64
	perShard int
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
	// heirs are the stores that inherited slots of this one (handover.go);
	// nil: none. Replaced whole under heirsMu.
	heirs   atomic.Pointer[[]heir]
	heirsMu sync.Mutex
	// ovs indexes the overrides by zone, with their audit (override.go).
	ovMu sync.Mutex
	ovs  ovIndex
}

type shard struct {
	mu sync.Mutex
	m  map[mapKey]entry
	// logs holds the sliding logs of the shard's sliding_log keys (entries
	// of Alg SlidingLog), kept out of m so that m holds no pointers; nil
	// until the shard's first sliding log.
	logs map[mapKey]*algorithms.Log
	// penalties holds the instant the penalty of a key started
	// (State.Penalized, penalty.go), kept out of m like logs: few keys are
	// penalized at once; nil until the shard's first penalty.
	penalties map[mapKey]int64
	// holders holds the holder ids of the shard's concurrency keys (entries
	// of Alg Concurrency, whose debt is their count: concurrency.go); nil
	// until the shard's first.
	holders map[mapKey][]uint64
	// pending holds the units of a key charged in flight (Request.InFlight,
	// algorithms/inflight.go) until their Refund settles them; kept apart
	// from the key's state, which a sweep or a reset may drop meanwhile;
	// nil until the shard's first.
	pending map[mapKey]int64
	// overrides holds the keys' overrides (override.go); nil until the
	// shard's first.
	overrides map[mapKey]algorithms.Override
	lastSweep int64   // Unix ms of the last sweep done to make room
	_         [8]byte // keep neighbouring shards' locks off one cache line
}

// roomSweepEvery is how often, at most, a full shard sweeps itself to make
// room before it displaces a key that still holds state.
const roomSweepEvery = 1000 // ms

// mapKey names one key's state: the zone by its number in the store's
// zoneIndex (24 bytes with padding, against 40 with the zone's name) and
// the identity token.
type mapKey struct {
	zone uint32
	key  algorithms.Key
}

// entry is one key's state: an algorithms.State without its Log (see
// shard.logs), the algorithm packed into the top byte of the scale, and the
// instant the key is back to full. 40 bytes and no pointers, so that the
// map is never scanned by the garbage collector.
type entry struct {
	debt, at, prev int64
	scaleAlg       uint64 // State.Scale (< 2^56) | State.Alg << 56
	fullAt         int64  // Unix ms at which the key is back to full and may be dropped
}

// scaleBits is how many low bits of entry.scaleAlg hold State.Scale. Every
// Scale that Step returns for a valid limit is far below 2^scaleBits: a
// window in milliseconds (at most algorithms.MaxRefill, < 2^42) or GCRA's
// unit (at most algorithms.MaxGCRAUnit, 2^26).
const scaleBits = 56

func (e *entry) alg() algorithms.Algorithm { return algorithms.Algorithm(e.scaleAlg >> scaleBits) }

// pack compacts st (but its Log) into an entry. A Scale outside [0, 2^56),
// which no valid limit produces, is stored as 0: no state.
func pack(st *algorithms.State, fullAt int64) entry {
	scale := uint64(st.Scale)
	if scale >= 1<<scaleBits {
		scale = 0
	}
	return entry{debt: st.Debt, at: st.At, prev: st.Prev, scaleAlg: scale | uint64(st.Alg)<<scaleBits, fullAt: fullAt}
}

// get returns k's state and whether the shard holds it. The caller holds
// sh.mu.
func (sh *shard) get(k mapKey) (st algorithms.State, ok bool) {
	e, ok := sh.m[k]
	if !ok {
		return st, false
	}
	st = algorithms.State{Debt: e.debt, At: e.at, Prev: e.prev, Scale: int64(e.scaleAlg & (1<<scaleBits - 1)), Alg: e.alg()}
	if st.Alg == algorithms.SlidingLog {
		st.Log = sh.logs[k]
	}
	if len(sh.penalties) > 0 {
		st.Penalized = sh.penalties[k]
	}
	return st, true
}

// set stores st under k. The caller holds sh.mu.
func (sh *shard) set(k mapKey, st *algorithms.State, fullAt int64) {
	if st.Log != nil {
		if sh.logs == nil {
			sh.logs = make(map[mapKey]*algorithms.Log)
		}
		sh.logs[k] = st.Log
	} else if len(sh.logs) > 0 {
		delete(sh.logs, k) // k may have been a sliding log before
	}
	sh.setPenalty(k, st.Penalized)
	if st.Alg != algorithms.Concurrency && len(sh.holders) > 0 {
		delete(sh.holders, k) // or a concurrency key
	}
	sh.m[k] = pack(st, fullAt)
}

// drop forgets k, whose entry is e. The caller holds sh.mu.
func (sh *shard) drop(k mapKey, e *entry) {
	delete(sh.m, k)
	switch e.alg() {
	case algorithms.SlidingLog:
		delete(sh.logs, k)
	case algorithms.Concurrency:
		delete(sh.holders, k)
	}
	if len(sh.penalties) > 0 {
		delete(sh.penalties, k)
	}
}

// zoneIndex numbers the zone names a store has seen, so that a key names
// its zone in 4 bytes. Zone names come from the configuration, so the index
// stays small; numbers are never reused (a zone removed by a reload keeps
// its number, and its keys expire as usual). Lookups read an immutable
// snapshot without locking; a new name copies it (once per zone).
type zoneIndex struct {
	mu   sync.Mutex // serialises additions
	snap atomic.Pointer[zoneSnapshot]
}

type zoneSnapshot struct {
	ids   map[string]uint32
	names []string // by number
}

// lookup returns name's number, if it has one.
func (z *zoneIndex) lookup(name string) (uint32, bool) {
	if sn := z.snap.Load(); sn != nil {
		id, ok := sn.ids[name]
		return id, ok
	}
	return 0, false
}

// id returns name's number, giving it one if it has none.
func (z *zoneIndex) id(name string) uint32 {
	if id, ok := z.lookup(name); ok {
		return id
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	old := z.snap.Load()
	if old == nil {
		old = &zoneSnapshot{}
	}
	if id, ok := old.ids[name]; ok {
		return id
	}
	id := uint32(len(old.names))
	sn := &zoneSnapshot{ids: make(map[string]uint32, len(old.ids)+1), names: append(slices.Clip(old.names), name)}
	for n, i := range old.ids {
		sn.ids[n] = i
	}
	sn.ids[name] = id
	z.snap.Store(sn)
	return id
}

// names returns the names by number: every number handed out before the
// call has its name.
func (z *zoneIndex) names() []string {
	if sn := z.snap.Load(); sn != nil {
		return sn.names
	}
	return nil
}

// New returns a running Store; Close stops its sweeper.
func New(cfg Config) *Store {
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.Now == nil {
		cfg.Now = func() int64 { return time.Now().UnixMilli() }
	}
	s := &Store{
		seed:     maphash.MakeSeed(),
		now:      cfg.Now,
		perShard: max(1, (cfg.MaxKeys+numShards-1)/numShards),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[mapKey]entry)
	}
	if cfg.SweepInterval > 0 {
		go s.sweeper(cfg.SweepInterval)
	} else {
		close(s.done)
	}
	return s
}

// Take decides reqs all at once and writes one decision per request to out
// (len(out) must be at least len(reqs)). If every request is allowed, all are
// charged; if any is refused, none is charged, and the decisions of the
// zones that would have allowed show their uncharged state. The requests of
// one call must name distinct (zone, key) pairs, as the zones of one handler
// do. It never fails.
func (s *Store) Take(_ context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
	switch len(reqs) {
	case 0:
		return nil
	case 1:
		s.takeOne(&reqs[0], &out[0])
		return nil
	}
	return s.takeMany(reqs, out)
}

func (s *Store) shardOf(k *mapKey) *shard {
	return &s.shards[maphash.Comparable(s.seed, *k)%numShards]
}

func (s *Store) takeOne(r *algorithms.Request, out *algorithms.Decision) {
	k := mapKey{zone: s.zones.id(r.Zone), key: r.Key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	now := s.now()
	st, ok := sh.get(k)
	d, next, fullAt, write := sh.decide(k, st, ok, r, now)
	if d.Allowed && !write {
		sh.took(k, r)
	} else if write && (d.Allowed || algorithms.StartsPenalty(st, !ok, next)) {
		s.put(sh, k, ok, &next, fullAt, now, nil)
		sh.took(k, r)
	}
	sh.mu.Unlock()
	if d.Allowed && r.Holder != 0 && s.heirs.Load() != nil {
		s.forwardTook(r.Zone, r.Key, r.Holder)
	}
	d.At = now
	*out = d
}

// takeMany locks every shard involved, in index order (so that concurrent
// multi-zone requests cannot deadlock), decides each request against the
// state as it is, and commits only if all allow.
func (s *Store) takeMany(reqs []algorithms.Request, out []algorithms.Decision) error {
	var idxBuf [8]uint8
	var keyBuf [8]mapKey
	var pendBuf [8]algorithms.State
	var fullBuf [8]int64
	var lockBuf [8]uint8
	var presentBuf, writeBuf [8]bool
	idx, keys, pend, fullAt, present, writes := idxBuf[:0], keyBuf[:0], pendBuf[:0], fullBuf[:0], presentBuf[:0], writeBuf[:0]
	for i := range reqs {
		k := mapKey{zone: s.zones.id(reqs[i].Zone), key: reqs[i].Key}
		keys = append(keys, k)
		idx = append(idx, uint8(maphash.Comparable(s.seed, k)%numShards))
	}
	locked := sortedUnique(append(lockBuf[:0], idx...))
	for _, i := range locked {
		s.shards[i].mu.Lock()
	}
	now := s.now()
	allowed := true
	for i := range reqs {
		sh := &s.shards[idx[i]]
		st, ok := sh.get(keys[i])
		d, next, full, write := sh.decide(keys[i], st, ok, &reqs[i], now)
		d.At = now
		out[i] = d
		pend = append(pend, next)
		fullAt = append(fullAt, full)
		present = append(present, ok)
		writes = append(writes, write)
		allowed = allowed && (d.Allowed || reqs[i].ReportOnly) // report-only zones never veto
	}
	for i := range reqs {
		switch {
		case allowed && out[i].Allowed:
			if writes[i] {
				s.put(&s.shards[idx[i]], keys[i], present[i], &pend[i], fullAt[i], now, keys)
			}
			s.shards[idx[i]].took(keys[i], &reqs[i])
		case !writes[i]:
			// an override that blocks or lifts the limit writes nothing
		case !out[i].Allowed:
			// A refusal (or a report-only zone's would-be refusal) charges
			// nothing, but may start the zone's penalty, whatever the
			// other zones decided (penalty.go).
			if st, _ := s.shards[idx[i]].get(keys[i]); algorithms.StartsPenalty(st, !present[i], pend[i]) {
				s.put(&s.shards[idx[i]], keys[i], present[i], &pend[i], fullAt[i], now, keys)
			}
		case !allowed:
			// Vetoed by another zone: report this zone's uncharged state.
			sh := &s.shards[idx[i]]
			st, _ := sh.get(keys[i])
			out[i] = sh.view(keys[i], st, present[i], reqs[i].Limit, now)
			out[i].At = now
		}
	}
	for _, i := range locked {
		s.shards[i].mu.Unlock()
	}
	if allowed && s.heirs.Load() != nil {
		for i := range reqs {
			if r := &reqs[i]; out[i].Allowed && r.Holder != 0 && r.Limit.Algorithm == algorithms.Concurrency {
				s.forwardTook(r.Zone, r.Key, r.Holder)
			}
		}
	}
	return nil
}

// put stores st under k, making room first when the shard is full. keep
// lists keys that must not be displaced (the other zones of the request
// being committed). The caller holds sh.mu.
func (s *Store) put(sh *shard, k mapKey, exists bool, st *algorithms.State, fullAt, now int64, keep []mapKey) {
	if !exists && len(sh.m) >= s.perShard {
		makeRoom(sh, s.perShard, now, keep)
	}
	sh.set(k, st, fullAt)
}

// makeRoom frees a place in a full shard. First it drops the shard's keys
// already back to full (forgetting them loses nothing), at most once every
// roomSweepEvery so that a flood of new keys cannot turn every insertion
// into a scan. Failing that, of a sample of evictionSample keys, it drops
// the one closest to full (forgetting it hands its owner the least). If the
// sample holds only keys in keep, nothing is dropped and the shard exceeds
// its share by one (only possible with a tiny max_keys).
func makeRoom(sh *shard, limit int, now int64, keep []mapKey) {
	if now-sh.lastSweep >= roomSweepEvery {
		sh.lastSweep = now
		sweepShard(sh, now)
		if len(sh.m) < limit {
			return
		}
	}
	var victim mapKey
	found := false
	best := int64(1<<63 - 1)
	n := 0
	for k, e := range sh.m {
		if e.fullAt <= now {
			sh.drop(k, &e)
			return
		}
		if e.fullAt < best && !slices.Contains(keep, k) {
			best, victim, found = e.fullAt, k, true
		}
		if n++; n == evictionSample {
			break
		}
	}
	if found {
		e := sh.m[victim]
		sh.drop(victim, &e)
	}
}

// Sweep drops every key that is back to full. The background sweeper calls
// it; tests may too.
func (s *Store) Sweep() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sweepShard(sh, s.now())
		sh.mu.Unlock()
	}
}

// sweepShard drops the shard's keys that are back to full. The caller holds
// sh.mu.
func sweepShard(sh *shard, now int64) {
	for k, e := range sh.m {
		if e.fullAt <= now {
			sh.drop(k, &e)
		}
	}
}

// Len returns the number of keys held.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Keys calls f for every key held, under the shard's lock: f must not call
// back into the store.
func (s *Store) Keys(f func(zone string, key algorithms.Key)) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		names := s.zones.names() // after the lock: it names every key held
		for k := range sh.m {
			f(names[k.zone], k.key)
		}
		sh.mu.Unlock()
	}
}

func (s *Store) sweeper(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Close stops the sweeper. The store still answers afterwards.
func (s *Store) Close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// Destruct implements caddy.Destructor: the last user of a pooled store
// stops it.
func (s *Store) Destruct() error {
	s.Close()
	return nil
}

// sortedUnique sorts a few shard indexes and drops repeats, in place.
func sortedUnique(a []uint8) []uint8 {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
	out := a[:0]
	for _, v := range a {
		if len(out) == 0 || v != out[len(out)-1] {
			out = append(out, v)
		}
	}
	return out
}

// setPenalty records when k's penalty started (0: none). The caller holds
// sh.mu.
func (sh *shard) setPenalty(k mapKey, at int64) {
	switch {
	case at != 0:
		if sh.penalties == nil {
			sh.penalties = make(map[mapKey]int64)
		}
		sh.penalties[k] = at
	case len(sh.penalties) > 0:
		delete(sh.penalties, k)
	}
}
