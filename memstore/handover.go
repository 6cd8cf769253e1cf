package memstore

import (
	"math"
	"slices"
	"weak"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Slots across a store change. A reload that changes a memory store's
// settings makes a new store, which starts empty, while the requests of
// the old configuration still running hold their slots in the old one.
// The new store (the heir) inherits them (Memory.InheritSlots): it copies
// the slots every other store of the process holds in the zones it is
// given, and each of those stores, from then on, also grants in the heir
// every slot it grants in those zones (the old configuration serves a
// moment longer) and also releases there every slot released to it. A
// slot is known by its holder id: one both copied and forwarded counts
// once, one released twice is released once.
//
// During the reload's overlap the old store decides its requests without
// seeing the heir's: a key may then exceed its limit by what the old
// configuration admits in that moment.

// heir is a store that inherited the slots of some zones.
type heir struct {
	to    weak.Pointer[Store] // a store no configuration uses any more is not kept
	zones map[string]bool
}

// handOver makes to the heir of s's slots in zones: from now on they are
// forwarded, and those s holds are copied.
func (s *Store) handOver(to *Store, zones []string) {
	set := make(map[string]bool, len(zones))
	s.heirsMu.Lock()
	var hs []heir
	if p := s.heirs.Load(); p != nil {
		for _, h := range *p {
			switch h.to.Value() {
			case nil: // gone
			case to:
				for z := range h.zones {
					set[z] = true
				}
			default:
				hs = append(hs, h)
			}
		}
	}
	for _, z := range zones {
		set[z] = true
	}
	hs = append(hs, heir{to: weak.Make(to), zones: set})
	s.heirs.Store(&hs)
	s.heirsMu.Unlock()
	// Copied under s's lock, so that a release in s either comes before
	// the copy (the slot is not copied) or is forwarded after it.
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		names := s.zones.names()
		for k, ids := range sh.holders {
			if set[names[k.zone]] {
				for _, id := range ids {
					to.adopt(names[k.zone], k.key, id)
				}
			}
		}
		sh.mu.Unlock()
	}
}

// adopt counts the slot of holder in key of zone, unless the store holds it
// already; it reports whether it was new.
func (s *Store) adopt(zone string, key algorithms.Key, holder uint64) bool {
	k := mapKey{zone: s.zones.id(zone), key: key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ids := sh.holders[k]
	if slices.Contains(ids, holder) {
		return false
	}
	_, ok := sh.m[k]
	ids = append(ids, holder)
	st := algorithms.State{Alg: algorithms.Concurrency, Debt: int64(len(ids))}
	s.put(sh, k, ok, &st, math.MaxInt64, s.now(), nil) // held: never swept nor evicted
	if sh.holders == nil {
		sh.holders = make(map[mapKey][]uint64)
	}
	sh.holders[k] = ids
	return true
}

// forwardTook grants the slot of holder in s's heirs of zone (and theirs).
// The caller holds no lock of s.
func (s *Store) forwardTook(zone string, key algorithms.Key, holder uint64) {
	for _, h := range *s.heirs.Load() {
		if to := h.to.Value(); to != nil && h.zones[zone] && to.adopt(zone, key, holder) && to.heirs.Load() != nil {
			to.forwardTook(zone, key, holder)
		}
	}
}

// forwardRelease releases the slot of holder in s's heirs of zone (and
// theirs). The caller holds no lock of s.
func (s *Store) forwardRelease(zone string, key algorithms.Key, holder uint64) {
	for _, h := range *s.heirs.Load() {
		if to := h.to.Value(); to != nil && h.zones[zone] && to.releaseHolder(zone, key, holder) && to.heirs.Load() != nil {
			to.forwardRelease(zone, key, holder)
		}
	}
}

// InheritSlots makes this store the heir of the slots that the process's
// other memory stores hold in zones (concurrency zones): a reload that
// changes the store's settings keeps counting the slots of the requests
// still running.
func (m *Memory) InheritSlots(zones []string) {
	pool.Range(func(_, v any) bool {
		if o := v.(*Store); o != m.Store {
			o.handOver(m.Store, zones)
		}
		return true
	})
}
