package memstore

import (
	"context"
	"slices"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Concurrency zones (algorithms.Concurrency): a key's entry counts its
// slots in use (its debt, which algorithms.Step reads), and the shard's
// leases map holds the holder id of each, so that Release gives back
// exactly the slot a request took: a slot whose key was reset (the admin
// API) or whose request was never admitted is not given back twice, and
// never frees another request's slot. Slots in memory have no expiry: a
// request holds its slot until the handler releases it, which it does on
// every exit path (the process ending ends every slot with it). An entry
// with slots in use is never swept nor evicted (its fullAt is
// math.MaxInt64); one back to no slot is forgotten like any key back to
// full, its holder slice kept meanwhile for the key's next request.

// took records the holder id of request r, just admitted and counted in k's
// entry, when r is of a concurrency zone. The caller holds sh.mu.
func (sh *shard) took(k mapKey, r *algorithms.Request) {
	if r.InFlight {
		if sh.pending == nil {
			sh.pending = make(map[mapKey]int64)
		}
		sh.pending[k] += r.Cost
	}
	if r.Limit.Algorithm != algorithms.Concurrency {
		return
	}
	if sh.holders == nil {
		sh.holders = make(map[mapKey][]uint64)
	}
	sh.holders[k] = append(sh.holders[k], r.Holder)
}

// release gives back the slot of holder in k, if k holds it, and reports
// whether it did. The caller holds sh.mu.
func (sh *shard) release(k mapKey, holder uint64, now int64) bool {
	ids := sh.holders[k]
	i := slices.Index(ids, holder)
	if i < 0 {
		return false // reset, or never admitted
	}
	ids[i] = ids[len(ids)-1]
	ids = ids[:len(ids)-1]
	sh.holders[k] = ids
	e, ok := sh.m[k]
	if !ok || e.alg() != algorithms.Concurrency {
		return true
	}
	e.debt = int64(len(ids))
	if len(ids) == 0 {
		e.fullAt = now // forgettable, as algorithms.Step says of an empty key
	}
	sh.m[k] = e
	return true
}

// Release gives back the slots that Take granted to the concurrency zones
// of reqs (their Holder), here and in the store's heirs (handover.go);
// requests of other zones are ignored. A holder the store does not hold
// (its key was reset, or the request was refused) is ignored too. It never
// fails and never blocks but on a shard's lock.
func (s *Store) Release(_ context.Context, reqs []algorithms.Request) error {
	for i := range reqs {
		r := &reqs[i]
		if r.Limit.Algorithm != algorithms.Concurrency || r.Holder == 0 {
			continue
		}
		s.releaseHolder(r.Zone, r.Key, r.Holder)
		if s.heirs.Load() != nil {
			s.forwardRelease(r.Zone, r.Key, r.Holder)
		}
	}
	return nil
}

// releaseHolder gives back the slot of holder in key of zone, and reports
// whether the store held it.
func (s *Store) releaseHolder(zone string, key algorithms.Key, holder uint64) bool {
	id, known := s.zones.lookup(zone)
	if !known {
		return false
	}
	k := mapKey{zone: id, key: key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.release(k, holder, s.now())
}

// InUse returns the slots in use of key in a concurrency zone (for tests
// and the admin API).
func (s *Store) InUse(zone string, key algorithms.Key) int {
	id, known := s.zones.lookup(zone)
	if !known {
		return 0
	}
	k := mapKey{zone: id, key: key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return len(sh.holders[k])
}
