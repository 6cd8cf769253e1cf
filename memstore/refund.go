package memstore

import (
	"context"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Refund gives back charges that Take made (algorithms.GiveBack: a zone that
// counts only some response statuses refunds the others), each under its
// shard's lock, at once. A charge whose key has been forgotten since (swept
// back to full, reset, or displaced) has nothing to give back. It never
// fails.
func (s *Store) Refund(_ context.Context, refunds []algorithms.Refund) error {
	for i := range refunds {
		r := &refunds[i]
		id, known := s.zones.lookup(r.Zone)
		if !known {
			continue
		}
		k := mapKey{zone: id, key: r.Key}
		sh := s.shardOf(&k)
		sh.mu.Lock()
		if st, ok := sh.get(k); ok {
			now := s.now()
			if next, fullAt, ok := algorithms.GiveBack(st, false, r.Limit, now, r.Cost, r.At); ok {
				sh.set(k, &next, fullAt)
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// Refund implements the store's refund (see Store.Refund).
func (m *Memory) Refund(ctx context.Context, refunds []algorithms.Refund) error {
	return m.store.Refund(ctx, refunds)
}
