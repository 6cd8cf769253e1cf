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
	seed     maphash.Seed
	now      func() int64
	perShard int
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

type shard struct {
	mu        sync.Mutex
	m         map[mapKey]entry
	lastSweep int64    // Unix ms of the last sweep done to make room
	_         [32]byte // keep neighbouring shards' locks off one cache line
}

// roomSweepEvery is how often, at most, a full shard sweeps itself to make
// room before it displaces a key that still holds state.
const roomSweepEvery = 1000 // ms

type mapKey struct {
	zone string
	key  algorithms.Key
}

type entry struct {
	st     algorithms.State
	fullAt int64 // Unix ms at which the key is back to full and may be dropped
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
	k := mapKey{zone: r.Zone, key: r.Key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	now := s.now()
	e, ok := sh.m[k]
	d, next, fullAt := algorithms.Step(e.st, !ok, r.Limit, now, r.Cost)
	if d.Allowed {
		s.put(sh, k, ok, entry{st: next, fullAt: fullAt}, now, nil)
	}
	sh.mu.Unlock()
	*out = d
}

// takeMany locks every shard involved, in index order (so that concurrent
// multi-zone requests cannot deadlock), decides each request against the
// state as it is, and commits only if all allow.
func (s *Store) takeMany(reqs []algorithms.Request, out []algorithms.Decision) error {
	var idxBuf [8]uint8
	var keyBuf [8]mapKey
	var pendBuf [8]entry
	var lockBuf [8]uint8
	var presentBuf [8]bool
	idx, keys, pend, present := idxBuf[:0], keyBuf[:0], pendBuf[:0], presentBuf[:0]
	for i := range reqs {
		k := mapKey{zone: reqs[i].Zone, key: reqs[i].Key}
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
		e, ok := sh.m[keys[i]]
		d, next, fullAt := algorithms.Step(e.st, !ok, reqs[i].Limit, now, reqs[i].Cost)
		out[i] = d
		pend = append(pend, entry{st: next, fullAt: fullAt})
		present = append(present, ok)
		allowed = allowed && (d.Allowed || reqs[i].ReportOnly) // report-only zones never veto
	}
	for i := range reqs {
		switch {
		case allowed && out[i].Allowed:
			s.put(&s.shards[idx[i]], keys[i], present[i], pend[i], now, keys)
		case allowed:
			// A report-only zone that would refuse: charged nothing, as
			// under enforcement.
		case out[i].Allowed:
			// Vetoed by another zone: report this zone's uncharged state.
			e := s.shards[idx[i]].m[keys[i]]
			out[i], _, _ = algorithms.Step(e.st, !present[i], reqs[i].Limit, now, 0)
		}
	}
	for _, i := range locked {
		s.shards[i].mu.Unlock()
	}
	return nil
}

// put stores e under k, making room first when the shard is full. keep
// lists keys that must not be displaced (the other zones of the request
// being committed). The caller holds sh.mu.
func (s *Store) put(sh *shard, k mapKey, exists bool, e entry, now int64, keep []mapKey) {
	if !exists && len(sh.m) >= s.perShard {
		makeRoom(sh, s.perShard, now, keep)
	}
	sh.m[k] = e
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
			delete(sh.m, k)
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
		delete(sh.m, victim)
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
			delete(sh.m, k)
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
		for k := range sh.m {
			f(k.zone, k.key)
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
