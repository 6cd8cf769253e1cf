package memstore

import (
	"context"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// This file serves the admin API (admin.api.rate_limit): read a key's state
// without charging it, and reset it.

// Peek returns key's view in zone under limit l as it stands now, without
// charging or writing anything (see algorithms.Peek: Remaining and
// ResetAfter as the state stands, Allowed and RetryAfter for a request of
// cost 1). found is false when the key holds no state, or only state that
// is back to full or was written by another algorithm (which a request
// would also treat as none); the decision is then the fresh key's.
func (s *Store) Peek(zone string, key algorithms.Key, l algorithms.Limit) (d algorithms.Decision, found bool) {
	id, known := s.zones.lookup(zone)
	if !known {
		return algorithms.Peek(algorithms.State{}, true, l, s.now()), false
	}
	k := mapKey{zone: id, key: key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st, ok := sh.get(k)
	now := s.now()
	if o, on := sh.overrideOf(k, now); on && l.Algorithm != algorithms.Concurrency {
		d = algorithms.PeekOverride(&o, st, !ok, l, now)
		return d, ok && d.ResetAfter > 0 || o.Block
	}
	d = algorithms.Peek(st, !ok, l, now)
	if l.Algorithm == algorithms.Concurrency {
		return d, ok && st.Alg == algorithms.Concurrency && st.Debt > 0 // slots in use
	}
	return d, ok && d.ResetAfter > 0
}

// Reset forgets key's state in zone, so its next request sees a full
// allowance. It reports whether there was state to forget.
func (s *Store) Reset(zone string, key algorithms.Key) bool {
	id, known := s.zones.lookup(zone)
	if !known {
		return false // no key of this zone was ever stored
	}
	k := mapKey{zone: id, key: key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if ok {
		sh.drop(k, &e)
	}
	return ok
}

// PeekKeys peeks several keys of one zone (see Peek) into out and found,
// sized by the caller to len(keys). It never fails.
func (s *Store) PeekKeys(_ context.Context, zone string, keys []algorithms.Key, l algorithms.Limit, out []algorithms.Decision, found []bool) error {
	for i, k := range keys {
		out[i], found[i] = s.Peek(zone, k, l)
	}
	return nil
}

// ResetKeys resets several keys of one zone (see Reset) and returns how
// many held state. It never fails.
func (s *Store) ResetKeys(_ context.Context, zone string, keys []algorithms.Key) (int, error) {
	n := 0
	for _, k := range keys {
		if s.Reset(zone, k) {
			n++
		}
	}
	return n, nil
}

// AdminInfo describes the store for the admin API's zone listing.
func (m *Memory) AdminInfo() map[string]any {
	return map[string]any{
		"module":         "memory",
		"max_keys":       m.MaxKeys,
		"sweep_interval": time.Duration(m.SweepInterval).String(),
	}
}

// PeekInFlight writes each key's units charged in flight (Request.InFlight:
// a count or settle zone's charges whose response has not settled them) to
// out, sized by the caller to len(keys). It never fails.
func (s *Store) PeekInFlight(_ context.Context, zone string, keys []algorithms.Key, _ algorithms.Limit, out []int64) error {
	id, known := s.zones.lookup(zone)
	for i, key := range keys {
		out[i] = 0
		if !known {
			continue
		}
		k := mapKey{zone: id, key: key}
		sh := s.shardOf(&k)
		sh.mu.Lock()
		out[i] = sh.pending[k]
		sh.mu.Unlock()
	}
	return nil
}
