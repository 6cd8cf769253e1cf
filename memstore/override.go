package memstore

import (
	"context"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/stores"
)

// Overrides (stores.Overrider): kept in this store's memory, so local to
// the instance, and kept across reloads with the store. The decision reads
// a key's override in its shard, under the lock it holds anyway
// (shard.overrides); the listing and its bound read the store's index
// (ovIndex), which holds the audit too.

// overrideOf returns k's override in force at now. The caller holds sh.mu.
func (sh *shard) overrideOf(k mapKey, now int64) (algorithms.Override, bool) {
	if len(sh.overrides) == 0 {
		return algorithms.Override{}, false
	}
	o, ok := sh.overrides[k]
	return o, ok && o.Expires > now
}

// decide decides r for key k, whose state is st (ok: it has one), under its
// override when one is in force. write reports that the decision may
// write the state (an override that blocks or lifts the limit writes
// nothing). The caller holds sh.mu.
func (sh *shard) decide(k mapKey, st algorithms.State, ok bool, r *algorithms.Request, now int64) (d algorithms.Decision, next algorithms.State, fullAt int64, write bool) {
	if o, on := sh.overrideOf(k, now); on {
		return algorithms.StepOverride(&o, st, !ok, r, now, sh.pending[k])
	}
	d, next, fullAt = algorithms.StepPending(st, !ok, r, now, sh.pending[k])
	return d, next, fullAt, true
}

// view is k's uncharged view (a zone vetoed by another) under limit l, or
// its override's limit. The caller holds sh.mu.
func (sh *shard) view(k mapKey, st algorithms.State, ok bool, l algorithms.Limit, now int64) algorithms.Decision {
	o, on := sh.overrideOf(k, now)
	if on {
		l = o.Apply(l)
	}
	d, _, _ := algorithms.Step(st, !ok, l, now, 0)
	d.Overridden = on
	return d
}

type ovIndex map[uint32]map[algorithms.Key]*stores.OverrideEntry

// SetOverride implements stores.Overrider.
func (s *Store) SetOverride(_ context.Context, zone string, e stores.OverrideEntry, maxN int) error {
	id := s.zones.id(zone)
	now := s.now()
	s.ovMu.Lock()
	defer s.ovMu.Unlock()
	if s.ovs == nil {
		s.ovs = ovIndex{}
	}
	m := s.ovs[id]
	if m == nil {
		m = map[algorithms.Key]*stores.OverrideEntry{}
		s.ovs[id] = m
	}
	if _, there := m[e.Key]; !there {
		s.expireLocked(id, m, now)
		if len(m) >= maxN {
			return stores.ErrTooManyOverrides
		}
	}
	m[e.Key] = &e
	k := mapKey{zone: id, key: e.Key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	if sh.overrides == nil {
		sh.overrides = make(map[mapKey]algorithms.Override)
	}
	sh.overrides[k] = e.Override
	sh.mu.Unlock()
	return nil
}

// DeleteOverride implements stores.Overrider.
func (s *Store) DeleteOverride(_ context.Context, zone string, key algorithms.Key) (stores.OverrideEntry, bool, error) {
	id, known := s.zones.lookup(zone)
	if !known {
		return stores.OverrideEntry{}, false, nil
	}
	s.ovMu.Lock()
	defer s.ovMu.Unlock()
	e, ok := s.ovs[id][key]
	if !ok || e.Expires <= s.now() {
		return stores.OverrideEntry{}, false, nil // an ended one is the listing's to report
	}
	s.dropOverrideLocked(id, key)
	return *e, true, nil
}

// Overrides implements stores.Overrider.
func (s *Store) Overrides(_ context.Context, zone string) (live, expired []stores.OverrideEntry, err error) {
	id, known := s.zones.lookup(zone)
	if !known {
		return nil, nil, nil
	}
	s.ovMu.Lock()
	defer s.ovMu.Unlock()
	m := s.ovs[id]
	expired = s.expireLocked(id, m, s.now())
	for _, e := range m {
		live = append(live, *e)
	}
	return live, expired, nil
}

// ExpireOverrides implements stores.Overrider.
func (s *Store) ExpireOverrides(_ context.Context, zone string) (int, []stores.OverrideEntry, error) {
	id, known := s.zones.lookup(zone)
	if !known {
		return 0, nil, nil
	}
	s.ovMu.Lock()
	defer s.ovMu.Unlock()
	m := s.ovs[id]
	expired := s.expireLocked(id, m, s.now())
	return len(m), expired, nil
}

// PeekOverrides implements stores.Overrider.
func (s *Store) PeekOverrides(_ context.Context, zone string, keys []algorithms.Key, out []*stores.OverrideEntry) error {
	id, known := s.zones.lookup(zone)
	s.ovMu.Lock()
	defer s.ovMu.Unlock()
	now := s.now()
	for i, k := range keys {
		out[i] = nil
		if e, ok := s.ovs[id][k]; known && ok && e.Expires > now {
			c := *e
			out[i] = &c
		}
	}
	return nil
}

// expireLocked removes zone id's overrides that ended by now and returns
// them. The caller holds s.ovMu.
func (s *Store) expireLocked(id uint32, m map[algorithms.Key]*stores.OverrideEntry, now int64) []stores.OverrideEntry {
	var out []stores.OverrideEntry
	for k, e := range m {
		if e.Expires <= now {
			out = append(out, *e)
			s.dropOverrideLocked(id, k)
		}
	}
	return out
}

// dropOverrideLocked forgets a key's override. The caller holds s.ovMu.
func (s *Store) dropOverrideLocked(id uint32, key algorithms.Key) {
	delete(s.ovs[id], key)
	k := mapKey{zone: id, key: key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	delete(sh.overrides, k)
	sh.mu.Unlock()
}

var _ stores.Overrider = (*Store)(nil)
