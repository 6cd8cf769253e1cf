package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/stores"
)

// The asynchronous mode (zone setting sync): docs/redis.md, "The
// asynchronous mode", tells how it works, its bound and its failures.
//
// What the code below keeps to: a key of a zone in the mode is decided
// here, under its shard's lock, by the algorithm's step on the key's state
// as Redis last returned it plus this instance's charges since (unsent,
// and sent in a sync not yet answered), each tagged with its window's
// start (algorithms.AddCharges); the request path calls no Redis. The sync
// loop sends, every interval, the charges of every key requested since the
// last sync, all zones together, pipelined (syncwire.go: a count per key
// and window in Redis, one INCRBY per key in the common case). Its reply
// replaces the keys' counts and ends their sent charges; a failed sync puts its
// charges back to be sent again (a reply lost after Redis applied them
// counts them twice: it errs toward refusing). A zone keeps at most its
// max_keys keys: past it, the least recently requested of a sample is
// dropped, its unsent units counted dropped. A sync looks only at the keys
// requested since the last (each shard's dirty list).

const (
	syncShards = 64
	// syncChunk bounds the keys of one pipeline (one round trip per
	// node): a pipeline's replies must all come within the client's read
	// timeout.
	syncChunk = 1000
	// syncLanes is how many such pipelines a sync has in flight at once
	// (fewer with a small pool_size: connConfig.syncLanes).
	syncLanes = 4
	// minSyncTimeout is the least time a sync waits for its reply, and
	// syncKeyTimeout what it adds per key (a sync of many keys takes Redis
	// a while: a bound that did not grow with them could fail every sync).
	minSyncTimeout = time.Second
	syncKeyTimeout = 50 * time.Microsecond
	// sweepEvery is how often the loop looks at every key kept, to forget
	// those back to full.
	sweepEvery = 5 * time.Second
	// finalAfter, with 4 intervals, is how long into a window a sliding
	// window's previous count is read again: by then every instance's late
	// charges for it (sent within an interval and a sync's time) landed.
	finalAfter = 250 * time.Millisecond
	// maxSyncZones bounds the zone names a store numbers for the mode
	// (syncKey.zone), over its life.
	maxSyncZones = 4096
)

// syncCfg is a zone's mode as the newest registration set it.
type syncCfg struct {
	interval time.Duration
	maxKeys  int
	id       uint16           // the zone's number (syncs.ids)
	limit    algorithms.Limit // the zone's (sync refuses a limit chosen per request)
}

type syncReg struct {
	id  uint64
	cfg syncCfg
}

// syncKey names a key of a zone (by its number). (A zone's limit is one:
// sync refuses a limit chosen per request; the entry keeps the limit it
// was last asked under, a reload's new one included.)
type syncKey struct {
	zone uint16
	key  algorithms.Key
}

// syncEntry is one key of a zone in the mode, in its shard's slab. It holds
// no pointer, nor does the shard's index, so that the garbage collector
// never scans the keys kept (hundreds of thousands). Its 128 bytes are two
// cache lines: what a request reads and writes, in the order it does; the
// limit is its zone's (syncs.lims). Guarded by its shard's mutex.
type syncEntry struct {
	k syncKey
	// read: Redis returned the key's counts once at least; touched:
	// requested since the last sync took the key (listed in its shard's
	// dirty); live: in use (else on the slab's free list); prevFinal: no
	// instance adds to prev any more (a sync does not read it again in
	// the window at); made: at's count in Redis has its TTL from this
	// instance (its syncs need no PEXPIRE then).
	read, touched, live, prevFinal, made bool
	used                                 usedSec // the last request
	// The key's state as Redis last returned it (algorithms.State's
	// fields: At, Scale, Prev, Debt).
	at, scale, prev, debt int64
	unsent                [2]algorithms.WindowCharge
	sent                  [2]algorithms.WindowCharge // in the sync running
}

// usedSec is an instant in seconds since 2020-01-01 (4 bytes, until 2156).
type usedSec uint32

// secondOf is the usedSec of now (Unix ms).
func secondOf(now int64) usedSec { return usedSec(max(now/1000-1_577_836_800, 0)) }

type syncShard struct {
	mu   sync.Mutex
	m    syncIndex // the keys' indices in slab (syncindex.go)
	slab []syncEntry
	free []uint32
	// dirty lists the entries touched since the last sync took them: a
	// sync reads these, not every key kept; spare is the list a sync
	// emptied, kept for its room.
	dirty, spare []uint32
	// bare: the entries whose count of a window (the value) this instance
	// made without a TTL (syncwire.go's expireLost failed): the next sync
	// sets it. Rare: nil but then.
	bare map[uint32]int64
}

// touch lists entry i for the next sync. Called with sh's lock held.
func (sh *syncShard) touch(i uint32) {
	if e := &sh.slab[i]; !e.touched {
		e.touched = true
		sh.dirty = append(sh.dirty, i)
	}
}

// entry returns k's entry index, if kept. Called with sh's lock held.
func (sh *syncShard) entry(k syncKey) (uint32, bool) {
	i, ok := sh.m.get(k, sh.slab)
	return i, ok
}

// drop forgets entry i. Called with sh's lock held.
func (sh *syncShard) drop(i uint32) {
	sh.m.del(sh.slab[i].k, i)
	delete(sh.bare, i)
	sh.slab[i] = syncEntry{}
	sh.free = append(sh.free, i)
}

// syncs is a store's zones in the asynchronous mode and their keys.
type syncs struct {
	s *Store

	regMu sync.Mutex
	regs  map[string][]syncReg
	ids   map[string]uint16 // the zones' numbers, never reused
	next  uint64
	zones atomic.Pointer[map[string]syncCfg] // nil: none
	// names are the zones by number (the sync loop builds keys from
	// them), keys each zone's keys kept.
	names atomic.Pointer[[]string]
	keys  [maxSyncZones]atomic.Int64
	// lims are the zones' limits by number, the newest registration's.
	lims [maxSyncZones]atomic.Pointer[algorithms.Limit]

	shards [syncShards]syncShard

	startOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
	// kick asks the loop for a sync now (tests, and Destruct's last one).
	kick chan chan struct{}

	swept time.Time // the last sweep (the loop's own)
	// lanes: the chunks of a sync in flight at once, each with its items
	// and the exchange's buffers, kept for their room (the loop's own).
	lanes [syncLanes]syncLane
	// taken: the shards' dirty lists a sync gathers from, at: where it
	// is (the loop's own).
	taken  [syncShards][]uint32
	at     struct{ sh, pos int }
	lastOK atomic.Int64 // Unix ns of the last successful sync's start
	// slowest is the longest sync of late (ns; an eighth forgotten per
	// sync): when syncs take longer than the interval, charges land later.
	slowest  atomic.Int64
	failures atomic.Int64 // syncs failed since
	lastErr  atomic.Pointer[string]
	dropped  atomic.Int64
	runs     atomic.Int64 // syncs done, for tests

	syncsOK, syncsFailed, droppedUnits prometheus.Counter
	lastSync                           prometheus.Gauge
	duration                           prometheus.Observer
}

func newSyncs(s *Store) *syncs {
	y := &syncs{s: s, regs: map[string][]syncReg{}, ids: map[string]uint16{},
		stop: make(chan struct{}), done: make(chan struct{}), kick: make(chan chan struct{})}
	y.names.Store(new([]string))
	lv := []string{"redis", s.opts.Target}
	y.syncsOK = storeMetrics.syncs.WithLabelValues(append(lv, "ok")...)
	y.syncsFailed = storeMetrics.syncs.WithLabelValues(append(lv, "failed")...)
	y.droppedUnits = storeMetrics.syncDropped.WithLabelValues(lv...)
	y.lastSync = storeMetrics.syncLast.WithLabelValues(lv...)
	y.duration = storeMetrics.syncDuration.WithLabelValues(lv...)
	return y
}

// SyncZone puts zone, whose limit is l, in the asynchronous mode (a Caddy
// handler calls it at Provision): synced every interval, at most maxKeys
// keys kept. The returned release ends this registration (at the
// handler's Cleanup); while a zone has several (a reload), the newest
// applies, and the keys kept carry over.
func (s *Store) SyncZone(zone string, l algorithms.Limit, interval time.Duration, maxKeys int) (release func(), err error) {
	switch {
	case !algorithms.Syncable(l.Algorithm):
		return nil, fmt.Errorf("sync: not with %s (fixed_window and sliding_window only)", l.Algorithm)
	case interval <= 0 || maxKeys < 1:
		return nil, fmt.Errorf("sync: the interval and max_keys must be positive, got %s and %d", interval, maxKeys)
	}
	y := s.syncs()
	y.regMu.Lock()
	zid, ok := y.ids[zone]
	if !ok {
		names := *y.names.Load()
		if len(names) >= maxSyncZones {
			y.regMu.Unlock()
			return nil, fmt.Errorf("sync: more than %d zones in the mode on one store", maxSyncZones)
		}
		zid = uint16(len(names))
		y.ids[zone] = zid
		names = append(names[:len(names):len(names)], zone)
		y.names.Store(&names)
	}
	y.next++
	id := y.next
	y.regs[zone] = append(y.regs[zone], syncReg{id: id, cfg: syncCfg{interval: interval, maxKeys: maxKeys, id: zid, limit: l}})
	y.publish()
	y.regMu.Unlock()
	y.startOnce.Do(func() { go y.run() })
	var once sync.Once
	return func() {
		once.Do(func() {
			y.regMu.Lock()
			defer y.regMu.Unlock()
			rs := y.regs[zone]
			for i, r := range rs {
				if r.id == id {
					rs = append(rs[:i:i], rs[i+1:]...)
					break
				}
			}
			if len(rs) == 0 {
				delete(y.regs, zone)
			} else {
				y.regs[zone] = rs
			}
			y.publish()
		})
	}, nil
}

// syncs returns s's zones in the mode, made on first use.
func (s *Store) syncs() *syncs {
	s.allowMu.Lock()
	defer s.allowMu.Unlock()
	if y := s.async.Load(); y != nil {
		return y
	}
	y := newSyncs(s)
	s.async.Store(y)
	return y
}

// publish makes the newest registration of each zone the one Take reads.
// Called with regMu held.
func (y *syncs) publish() {
	if len(y.regs) == 0 {
		y.zones.Store(nil)
		return
	}
	m := make(map[string]syncCfg, len(y.regs))
	for z, rs := range y.regs {
		cfg := rs[len(rs)-1].cfg
		m[z] = cfg
		y.lims[cfg.id].Store(&cfg.limit)
	}
	y.zones.Store(&m)
}

// SyncStatus reports zone's mode on this instance (false: not in it).
func (s *Store) SyncStatus(zone string) (stores.SyncStatus, bool) {
	y := s.async.Load()
	if y == nil {
		return stores.SyncStatus{}, false
	}
	m := y.zones.Load()
	if m == nil {
		return stores.SyncStatus{}, false
	}
	cfg, ok := (*m)[zone]
	if !ok {
		return stores.SyncStatus{}, false
	}
	st := stores.SyncStatus{Interval: y.period(), Keys: int(y.keys[cfg.id].Load()), MaxKeys: cfg.maxKeys,
		Failures: y.failures.Load(), Dropped: y.dropped.Load()}
	if ns := y.lastOK.Load(); ns != 0 {
		st.LastSync = time.Unix(0, ns)
	}
	if e := y.lastErr.Load(); e != nil {
		st.Error = *e
	}
	for i := range y.shards {
		sh := &y.shards[i]
		sh.mu.Lock()
		for i := range sh.slab {
			if e := &sh.slab[i]; e.live && e.k.zone == cfg.id {
				st.Held += e.unsent[0].Units + e.unsent[1].Units + e.sent[0].Units + e.sent[1].Units
			}
		}
		sh.mu.Unlock()
	}
	return st, true
}

// peekSynced replaces, for the keys of zone kept in the asynchronous mode,
// the admin API's view of Redis's state with this instance's (Redis's as
// last read plus the charges not yet confirmed): what it decides on.
func (s *Store) peekSynced(zone string, keys []algorithms.Key, l algorithms.Limit, out []algorithms.Decision, found []bool) {
	y := s.async.Load()
	if y == nil {
		return
	}
	cfgs := y.zones.Load()
	if cfgs == nil {
		return
	}
	cfg, ok := (*cfgs)[zone]
	if !ok {
		return
	}
	now := time.Now().UnixMilli()
	for i, key := range keys {
		k := syncKey{zone: cfg.id, key: key}
		sh := y.shard(&k)
		sh.mu.Lock()
		if j, ok := sh.entry(k); ok {
			st, _ := sh.slab[j].view(l, now)
			out[i] = algorithms.Peek(st, false, l, now)
			found[i] = out[i].ResetAfter > 0
		}
		sh.mu.Unlock()
	}
}

// syncCfg returns zone's mode on this instance (false: not in it).
func (s *Store) syncCfg(zone string) (syncCfg, bool) {
	if y := s.async.Load(); y != nil {
		if m := y.zones.Load(); m != nil {
			cfg, ok := (*m)[zone]
			return cfg, ok
		}
	}
	return syncCfg{}, false
}

// countKey is the key of name's count in the window starting at start, as
// the asynchronous mode names it (syncwire.go).
func countKey(name string, start int64) string {
	return string(appendCountKey([]byte(name), start))
}

// appendCountKey appends countKey's suffix to a key's name.
func appendCountKey(b []byte, start int64) []byte {
	return strconv.AppendInt(append(b, ':'), start, 10)
}

// peekCounts is peekOn for a zone in the asynchronous mode: the counts of
// the current and the previous window at Redis's clock, viewed as the
// algorithm's state.
func peekCounts(ctx context.Context, c redis.Cmdable, names []string, l algorithms.Limit, out []algorithms.Decision, found []bool) error {
	t, err := c.Time(ctx).Result()
	if err != nil {
		return err
	}
	ms := t.UnixMilli()
	w := l.Window
	start := algorithms.WindowStart(ms, w)
	pipe := c.Pipeline()
	curs := make([]*redis.StringCmd, len(names))
	prevs := make([]*redis.StringCmd, len(names))
	for i, n := range names {
		curs[i] = pipe.Get(ctx, countKey(n, start))
		prevs[i] = pipe.Get(ctx, countKey(n, start-w))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	for i := range names {
		cur, _ := strconv.ParseInt(curs[i].Val(), 10, 64)
		prev, _ := strconv.ParseInt(prevs[i].Val(), 10, 64)
		if l.Algorithm == algorithms.FixedWindow {
			prev = 0
		}
		st := algorithms.State{Alg: l.Algorithm, At: start, Scale: w, Debt: min(cur, l.Events), Prev: min(prev, l.Events)}
		fresh := cur <= 0 && prev <= 0
		out[i] = algorithms.Peek(st, fresh, l, ms)
		found[i] = !fresh && out[i].ResetAfter > 0
	}
	return nil
}

// forgetSynced drops this instance's view of the keys of zone (the admin
// API reset them in Redis), their unconfirmed charges with it; the next
// request reads the key afresh at its sync.
func (s *Store) forgetSynced(zone string, keys []algorithms.Key) {
	y := s.async.Load()
	if y == nil {
		return
	}
	y.regMu.Lock()
	id, ok := y.ids[zone]
	y.regMu.Unlock()
	if !ok {
		return
	}
	for _, key := range keys {
		k := syncKey{zone: id, key: key}
		sh := y.shard(&k)
		sh.mu.Lock()
		if j, ok := sh.entry(k); ok {
			sh.drop(j)
			y.keys[id].Add(-1)
		}
		sh.mu.Unlock()
	}
}

// asyncLayer decides the zones in the asynchronous mode here (syncs.take)
// and passes the others to next.
func (s *Store) asyncLayer(next stores.Store) stores.Store {
	return stores.TakeFunc(func(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
		if y := s.async.Load(); y != nil {
			if cfgs := y.zones.Load(); cfgs != nil && y.uses(*cfgs, reqs) {
				return y.take(ctx, next, *cfgs, reqs, out)
			}
		}
		return next.Take(ctx, reqs, out)
	})
}

// mine reports whether r is decided here.
func mine(cfgs map[string]syncCfg, r *algorithms.Request) bool {
	_, ok := cfgs[r.Zone]
	return ok && algorithms.Syncable(r.Limit.Algorithm) && !r.Leaves()
}

func (y *syncs) uses(cfgs map[string]syncCfg, reqs []algorithms.Request) bool {
	for i := range reqs {
		if mine(cfgs, &reqs[i]) {
			return true
		}
	}
	return false
}

func (y *syncs) shard(k *syncKey) *syncShard {
	h := uint32(2166136261)
	for i := range k.key {
		h = (h ^ uint32(k.key[i])) * 16777619
	}
	h = (h ^ uint32(k.zone)) * 16777619
	return &y.shards[h%syncShards]
}

// take decides reqs, some of whose zones are in the mode: those here, the
// others by next, all-or-nothing (a charge made here is taken back when
// another zone refuses).
func (y *syncs) take(ctx context.Context, next stores.Store, cfgs map[string]syncCfg, reqs []algorithms.Request, out []algorithms.Decision) error {
	now := time.Now().UnixMilli()
	var kbuf [8]syncKey
	var hbuf [8]bool
	keys, ents := kbuf[:0], hbuf[:0] // ents[i]: reqs[i] is decided here, its key keys[i]
	if len(reqs) > len(kbuf) {
		keys, ents = make([]syncKey, 0, len(reqs)), make([]bool, 0, len(reqs))
	}
	keys, ents = keys[:len(reqs)], ents[:len(reqs)]
	clear(ents)
	all, here := true, 0
	for i := range reqs {
		r := &reqs[i]
		cfg, ok := cfgs[r.Zone]
		if !ok || !algorithms.Syncable(r.Limit.Algorithm) || r.Leaves() {
			continue
		}
		here++
		k := syncKey{zone: cfg.id, key: r.Key}
		sh := y.shard(&k)
		sh.mu.Lock()
		j, ok := sh.entry(k)
		if !ok {
			j = y.add(sh, k, cfg)
		}
		out[i] = sh.slab[j].decide(r, now, true)
		sh.touch(j)
		sh.mu.Unlock()
		keys[i], ents[i] = k, true
		if !out[i].Allowed && !r.ReportOnly {
			all = false
		}
	}
	if !all {
		y.takeBack(reqs, keys, ents, out, now)
		for i := range reqs {
			if !ents[i] {
				// Not asked: nothing charged, and no state read to show.
				c := reqs[i].Limit.Capacity()
				out[i] = algorithms.Decision{Allowed: true, Limit: c, Remaining: c}
			}
		}
		return nil
	}
	if here == len(reqs) {
		return nil
	}
	// The other zones go to next in one call.
	buf := subTakes.Get().(*subTake)
	defer subTakes.Put(buf)
	sub, subOut := buf.reqs[:0], buf.out[:0]
	if n := len(reqs) - here; n > len(buf.reqs) {
		sub, subOut = make([]algorithms.Request, 0, n), make([]algorithms.Decision, 0, n)
	}
	for i := range reqs {
		if !ents[i] {
			r := reqs[i]
			r.FailApart = false // decided whole: the charges here are taken back on any failure
			sub = append(sub, r)
			subOut = append(subOut, algorithms.Decision{})
		}
	}
	if err := next.Take(ctx, sub, subOut); err != nil {
		y.takeBack(reqs, keys, ents, out, now)
		return err
	}
	j := 0
	for i := range reqs {
		if !ents[i] {
			out[i] = subOut[j]
			if !subOut[j].Allowed && !reqs[i].ReportOnly {
				all = false
			}
			j++
		}
	}
	if !all {
		y.takeBack(reqs, keys, ents, out, now)
	}
	return nil
}

// takeBack takes back the charges take made (a zone vetoed the request),
// and shows each zone that allowed as it stands.
func (y *syncs) takeBack(reqs []algorithms.Request, keys []syncKey, ents []bool, out []algorithms.Decision, now int64) {
	for i, mine := range ents {
		if !mine || !out[i].Allowed {
			continue
		}
		r := &reqs[i]
		sh := y.shard(&keys[i])
		sh.mu.Lock()
		// (Dropped for max_keys meanwhile: its charge went with it.)
		if j, ok := sh.entry(keys[i]); ok {
			e := &sh.slab[j]
			e.uncharge(algorithms.WindowStart(now, r.Limit.Window), r.Cost)
			out[i] = e.decide(r, now, false)
		}
		sh.mu.Unlock()
	}
}

// add makes k's entry in sh, dropping another key of its zone when the
// zone keeps its max_keys already. Called with sh's lock held.
func (y *syncs) add(sh *syncShard, k syncKey, cfg syncCfg) uint32 {
	if y.keys[cfg.id].Load() >= int64(cfg.maxKeys) {
		y.evict(sh, k.zone)
	}
	var j uint32
	if n := len(sh.free); n > 0 {
		j, sh.free = sh.free[n-1], sh.free[:n-1]
	} else {
		j = uint32(len(sh.slab))
		sh.slab = append(sh.slab, syncEntry{})
	}
	sh.slab[j] = syncEntry{k: k, live: true}
	sh.m.put(k, j, sh.slab)
	y.keys[cfg.id].Add(1)
	return j
}

// evict drops a key of zone from sh (whose lock is held), the least
// recently requested of those it holds, or else from another shard.
func (y *syncs) evict(sh *syncShard, zone uint16) {
	if y.evictIn(sh, zone) {
		return
	}
	for i := range y.shards {
		o := &y.shards[i]
		if o == sh || !o.mu.TryLock() {
			continue // a shard busy now (or a lock order that could deadlock): the next one
		}
		ok := y.evictIn(o, zone)
		o.mu.Unlock()
		if ok {
			return
		}
	}
	// Every other shard busy: the zone keeps one key more for a moment.
}

// evictSample is how many keys of a shard eviction compares: the least
// recently requested of a sample (a map's walk starts at random), as
// Redis's approximate LRU, so that a zone at its bound does not walk a
// whole shard per new key.
const evictSample = 8

// evictIn drops one of sh's keys of zone, the least recently requested of
// a sample. Called with sh's lock held.
func (y *syncs) evictIn(sh *syncShard, zone uint16) bool {
	victim, found := uint32(0), false
	seen := 0
	for j := range sh.m.each {
		if sh.slab[j].k.zone != zone {
			continue
		}
		if !found || sh.slab[j].used < sh.slab[victim].used {
			victim, found = j, true
		}
		if seen++; seen == evictSample {
			break
		}
	}
	if !found {
		return false
	}
	ve := &sh.slab[victim]
	if n := ve.unsent[0].Units + ve.unsent[1].Units; n > 0 {
		y.dropped.Add(n)
		y.droppedUnits.Add(float64(n))
	}
	// Its charges in a sync running are counted by the sync if it fails.
	sh.drop(victim)
	y.keys[zone].Add(-1)
	return true
}

// view is the key's state as this instance sees it at now: Redis's last
// reply plus the charges it has not confirmed.
func (e *syncEntry) view(l algorithms.Limit, now int64) (algorithms.State, int64) {
	cs := [4]algorithms.WindowCharge{e.sent[0], e.sent[1], e.unsent[0], e.unsent[1]}
	g := algorithms.State{Alg: l.Algorithm, At: e.at, Scale: e.scale, Prev: e.prev, Debt: e.debt}
	st, fullAt, _ := algorithms.AddCharges(g, !e.read, l, now, cs[:])
	return st, fullAt
}

// decide decides r at now on the key's view, charging it when allowed and
// charge is set. Called with the shard's lock held.
func (e *syncEntry) decide(r *algorithms.Request, now int64, charge bool) algorithms.Decision {
	st, _ := e.view(r.Limit, now)
	cost := r.Cost
	if !charge {
		cost = 0
	}
	d, _, _ := algorithms.Step(st, false, r.Limit, now, cost)
	if charge {
		if d.Allowed && cost > 0 {
			e.charge(algorithms.WindowStart(now, r.Limit.Window), cost)
		}
		e.used = secondOf(now)
	}
	if r.Refundable {
		d.At = now
	}
	return d
}

// charge adds units to the unsent charges of the window starting at start.
func (e *syncEntry) charge(start, units int64) {
	for j := range e.unsent {
		if e.unsent[j].Units > 0 && e.unsent[j].Start == start {
			e.unsent[j].Units += units
			return
		}
	}
	// A free slot, or the older window's (two windows back by now: it
	// counts no more).
	j := 0
	if e.unsent[0].Units > 0 && (e.unsent[1].Units == 0 || e.unsent[1].Start < e.unsent[0].Start) {
		j = 1
	}
	e.unsent[j] = algorithms.WindowCharge{Start: start, Units: units}
}

// uncharge takes units back from the unsent charges of the window
// starting at start; a charge a sync took meanwhile stays counted.
func (e *syncEntry) uncharge(start, units int64) {
	for j := range e.unsent {
		if e.unsent[j].Start == start && e.unsent[j].Units > 0 {
			e.unsent[j].Units = max(e.unsent[j].Units-units, 0)
			return
		}
	}
}

// unsend puts the charges of a failed sync back with the unsent ones.
func (e *syncEntry) unsend() {
	for _, c := range e.sent {
		if c.Units > 0 {
			e.charge(c.Start, c.Units)
		}
	}
	e.sent = [2]algorithms.WindowCharge{}
}

// period is the loop's interval: the shortest of the zones'.
func (y *syncs) period() time.Duration {
	p := time.Duration(0)
	if m := y.zones.Load(); m != nil {
		for _, c := range *m {
			if p == 0 || c.interval < p {
				p = c.interval
			}
		}
	}
	if p == 0 {
		p = time.Second
	}
	return p
}

// run syncs every period until the store closes.
func (y *syncs) run() {
	defer close(y.done)
	next := time.Now()
	for {
		// Every period from one sync's start to the next; a sync that
		// took longer is followed by the next at once.
		next = next.Add(y.period())
		wait := time.Until(next)
		if wait < 0 {
			next, wait = time.Now(), 0
		}
		t := time.NewTimer(wait)
		select {
		case <-y.stop:
			t.Stop()
			return
		case ack := <-y.kick:
			t.Stop()
			y.syncOnce()
			close(ack)
		case <-t.C:
			y.syncOnce()
		}
	}
}

// syncNow runs a sync and waits for it (tests).
func (y *syncs) syncNow() {
	ack := make(chan struct{})
	select {
	case y.kick <- ack:
		<-ack
	case <-y.done:
	}
}

// close stops the loop after a last sync of what it holds.
func (y *syncs) close() {
	started := true
	y.startOnce.Do(func() { started = false })
	if !started {
		return
	}
	y.syncNow()
	close(y.stop)
	<-y.done
}

// syncItem is one key of a sync.
type syncItem struct {
	k     syncKey
	j     uint32 // its entry
	sh    uint8  // its shard
	sent  [2]algorithms.WindowCharge
	limit algorithms.Limit
	l     int64 // the current window's start, by this instance's clock
	// known: the entry holds the previous window's count final for l;
	// made: l's count exists in Redis with its TTL, as far as the entry
	// knows (else the sync sets the TTL with its first charge).
	known, made bool
	// The reply: the counts of the current and the previous window (-1:
	// not read, the entry's final one stands); created: l's count got its
	// TTL; lost: it had not been made after all (a reset, a Redis
	// restarted empty) and could not be given its TTL: the next sync sets
	// it (the entry's bare, sent as the item's).
	cur, prev     int64
	created, lost bool
	bare          int64
	err           error
}

// syncOnce sends the charges of every key requested since the last sync
// and reads their counts back, syncChunk keys per pipeline, syncLanes
// pipelines at once (gather, exchange, answer: its buffers stay that size,
// and a round trip's wait overlaps the others'); now and then
// (sweepEvery) it forgets the keys back to full and not requested since.
// After a pipeline whose every key failed, the rest is not sent: put back
// for the next sync.
func (y *syncs) syncOnce() {
	start := time.Now()
	now := start.UnixMilli()
	if start.Sub(y.swept) >= sweepEvery {
		y.sweep(now)
		y.swept = start
	}
	y.takeDirty()
	defer y.giveBack()
	var first, down error
	keys := 0
	lanes := y.s.opts.SyncLanes
	if lanes <= 0 || lanes > syncLanes {
		lanes = syncLanes
	}
	for {
		n := 0
		for ; n < lanes; n++ {
			ln := &y.lanes[n]
			if ln.items = y.gather(now, ln.items[:0]); len(ln.items) == 0 {
				break
			}
			keys += len(ln.items)
		}
		if n == 0 {
			break
		}
		if down == nil {
			y.exchangeLanes(y.lanes[:n], now)
		}
		for i := range y.lanes[:n] {
			ln := &y.lanes[i]
			switch {
			case down != nil:
				for j := range ln.items {
					ln.items[j].err = down // not sent
				}
			case ln.err != nil && first == nil:
				first = ln.err
			}
			y.answer(ln.items, now)
		}
		for i := range y.lanes[:n] {
			if ln := &y.lanes[i]; down == nil && ln.err != nil && failedAll(ln.items) {
				down = ln.err
			}
		}
	}
	took, slowest := time.Since(start), y.slowest.Load()
	y.slowest.Store(max(int64(took), slowest-slowest/8))
	if keys == 0 {
		y.succeeded(start)
		return
	}
	y.duration.Observe(took.Seconds())
	y.report(start, keys, first)
}

// finality is how long into a window a sliding window's previous count
// is final (ms): 4 intervals, or 4 of the slowest syncs of late when
// longer, and finalAfter: by then every instance's late charges for it,
// sent by its next sync, have landed (each instance as slow as this one).
func (y *syncs) finality() int64 {
	return (4*max(y.period(), time.Duration(y.slowest.Load())) + finalAfter).Milliseconds()
}

// syncLane is a chunk of a sync in flight: its items, the exchange's
// buffers and its error.
type syncLane struct {
	items []syncItem
	wire  syncWire
	err   error
}

// exchangeLanes exchanges each lane's items at once, a goroutine each
// beside the loop's.
func (y *syncs) exchangeLanes(lanes []syncLane, now int64) {
	var wg sync.WaitGroup
	for i := 1; i < len(lanes); i++ {
		wg.Add(1)
		go func(ln *syncLane) {
			defer wg.Done()
			ln.err = y.exchangeOn(&ln.wire, ln.items, now)
		}(&lanes[i])
	}
	lanes[0].err = y.exchangeOn(&lanes[0].wire, lanes[0].items, now)
	wg.Wait()
}

// failedAll reports whether every item of a sync failed.
func failedAll(items []syncItem) bool {
	for i := range items {
		if items[i].err == nil {
			return false
		}
	}
	return true
}

// report logs and counts a sync of keys that started at start.
func (y *syncs) report(start time.Time, keys int, err error) {
	if err != nil {
		if y.failures.Add(1) == 1 && y.s.opts.Logger != nil {
			// Once per run of failures; the recovery is logged too.
			y.s.opts.Logger.Warn("redis sync of the asynchronous zones failed; they go on deciding here and send their charges when a sync succeeds",
				zap.String("target", y.s.opts.Target), zap.Int("keys", keys), zap.Error(err))
		}
		y.syncsFailed.Inc()
		msg := err.Error()
		y.lastErr.Store(&msg)
	} else {
		if n := y.failures.Load(); n > 0 && y.s.opts.Logger != nil {
			y.s.opts.Logger.Info("redis sync of the asynchronous zones succeeded again",
				zap.String("target", y.s.opts.Target), zap.Int64("failed_syncs", n), zap.Int("keys", keys))
		}
		y.succeeded(start)
	}
	y.runs.Add(1)
}

// takeDirty takes each shard's list of the keys requested since the last
// sync (its dirty list) for this sync to gather from. A key listed stays
// touched until gathered: a request meanwhile adds to what the sync sends.
func (y *syncs) takeDirty() {
	for i := range y.shards {
		sh := &y.shards[i]
		sh.mu.Lock()
		y.taken[i] = sh.dirty
		sh.dirty, sh.spare = sh.spare[:0], nil
		sh.mu.Unlock()
	}
	y.at.sh, y.at.pos = 0, 0
}

// giveBack returns the lists takeDirty took to their shards, for their room.
func (y *syncs) giveBack() {
	for i := range y.shards {
		if y.taken[i] == nil {
			continue
		}
		sh := &y.shards[i]
		sh.mu.Lock()
		sh.spare = y.taken[i][:0]
		sh.mu.Unlock()
		y.taken[i] = nil
	}
}

// gather takes the next keys of the lists takeDirty took, at most
// syncChunk, their unsent charges becoming sent, as a sync's items, listed
// shard by shard, appended to items (none: none left).
func (y *syncs) gather(now int64, items []syncItem) []syncItem {
	for ; y.at.sh < syncShards && len(items) < syncChunk; y.at.sh, y.at.pos = y.at.sh+1, 0 {
		list := y.taken[y.at.sh]
		if y.at.pos >= len(list) {
			continue
		}
		sh := &y.shards[y.at.sh]
		sh.mu.Lock()
		n := y.at.pos
		for ; n < len(list) && len(items) < syncChunk; n++ {
			j := list[n]
			e := &sh.slab[j]
			if !e.live || !e.touched {
				continue // dropped for max_keys meanwhile, or listed twice (its slot reused)
			}
			e.sent, e.unsent, e.touched = e.unsent, [2]algorithms.WindowCharge{}, false
			l := *y.lims[e.k.zone].Load()
			it := syncItem{k: e.k, j: j, sh: uint8(y.at.sh), sent: e.sent, limit: l, l: algorithms.WindowStart(now, l.Window)}
			cur := e.read && e.at == it.l
			it.known, it.made = cur && e.prevFinal, cur && e.made
			if sh.bare != nil {
				it.bare = sh.bare[j]
			}
			items = append(items, it)
		}
		sh.mu.Unlock()
		if n < len(list) {
			y.at.pos = n
			return items // the chunk is full: this shard's list goes on at n
		}
	}
	return items
}

// answer gives each item's entry its reply: the counts adopted, or on an
// error the charges put back to be sent again.
func (y *syncs) answer(items []syncItem, now int64) {
	final := y.finality()
	var sh *syncShard // locked once per run of its items (listed shard by shard)
	for i := range items {
		it := &items[i]
		if next := &y.shards[it.sh]; next != sh {
			if sh != nil {
				sh.mu.Unlock()
			}
			sh = next
			sh.mu.Lock()
		}
		// Its entry, unless dropped (for max_keys, or a reset) meanwhile.
		e := &sh.slab[it.j]
		kept := e.live && e.k == it.k
		switch {
		case kept && it.err == nil:
			e.adopt(it, now, final)
			switch {
			case it.lost:
				if sh.bare == nil {
					sh.bare = map[uint32]int64{}
				}
				sh.bare[it.j] = it.l
				sh.touch(it.j) // its TTL set by the next sync
			case it.bare != 0:
				delete(sh.bare, it.j)
			}
		case kept:
			e.unsend()
			sh.touch(it.j) // sent again by the next sync
		case it.err != nil:
			// Dropped while its sync failed.
			if n := it.sent[0].Units + it.sent[1].Units; n > 0 {
				y.dropped.Add(n)
				y.droppedUnits.Add(float64(n))
			}
		}
	}
	if sh != nil {
		sh.mu.Unlock()
	}
}

// adopt makes the counts a sync returned at now the key's state, its sent
// charges counted in them. A previous count read finalAfter (ms) or more
// into its window is final. Called with the shard's lock held.
func (e *syncEntry) adopt(it *syncItem, now, finalAfter int64) {
	w, n := it.limit.Window, it.limit.Events
	prev := it.prev
	switch {
	case it.limit.Algorithm == algorithms.FixedWindow:
		prev = 0
	case prev < 0:
		prev = e.prev // final, for this window (the sync read it only otherwise)
	default:
		e.prevFinal = now-it.l >= finalAfter
	}
	e.made = it.created || it.made && !it.lost
	e.at, e.scale, e.prev, e.debt, e.read = it.l, w, min(prev, n), min(it.cur, n), true
	e.sent = [2]algorithms.WindowCharge{}
}

// sweep forgets the keys that hold nothing to send and are back to full
// (their windows over), and those of zones no longer in the mode.
func (y *syncs) sweep(now int64) {
	var live [maxSyncZones]bool
	if cfgs := y.zones.Load(); cfgs != nil {
		for _, c := range *cfgs {
			live[c.id] = true
		}
	}
	for i := range y.shards {
		sh := &y.shards[i]
		sh.mu.Lock()
		for j := range sh.slab {
			e := &sh.slab[j]
			if !e.live || e.touched || e.unsent[0].Units+e.unsent[1].Units+e.sent[0].Units+e.sent[1].Units > 0 {
				continue
			}
			zone := e.k.zone
			if live[zone] {
				l := y.lims[zone].Load()
				if secondOf(now)-e.used <= usedSec(l.Window/1000) {
					continue // requested within a window: not full, or hardly (the next sweep)
				}
				if _, fullAt := e.view(*l, now); fullAt > now {
					continue
				}
			}
			sh.drop(uint32(j))
			y.keys[zone].Add(-1)
		}
		sh.mu.Unlock()
	}
}

func (y *syncs) succeeded(start time.Time) {
	y.lastOK.Store(start.UnixNano())
	y.failures.Store(0)
	y.lastErr.Store(nil)
	y.syncsOK.Inc()
	y.lastSync.Set(float64(start.UnixNano()) / 1e9)
}
