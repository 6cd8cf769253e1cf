package memstore

import (
	"context"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Refund gives back charges that Take made (algorithms.GiveBack: a zone that
// counts only some response statuses refunds the others), each under its
// shard's lock, at once, and settles those taken in flight (a Keep refund
// only settles). A Settle refund settles the charge to its actual amount
// (algorithms.Settle): given back, or charged on top. A charge whose key has been forgotten since (swept
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
		if r.InFlight {
			sh.settle(k, r.Cost)
		}
		if r.Settle {
			// Settled to the actual amount: charged on top even when the
			// key was forgotten meanwhile.
			st, ok := sh.get(k)
			if next, fullAt, ok := algorithms.Settle(st, !ok, r.Limit, s.now(), r.Cost, r.Settled, r.At); ok {
				sh.set(k, &next, fullAt)
			}
		} else if st, ok := sh.get(k); ok && !r.Keep {
			now := s.now()
			if next, fullAt, ok := algorithms.GiveBack(st, false, r.Limit, now, r.Cost, r.At); ok {
				sh.set(k, &next, fullAt)
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// settle takes cost off k's units charged in flight. The caller holds
// sh.mu.
func (sh *shard) settle(k mapKey, cost int64) {
	if n, ok := sh.pending[k]; ok {
		if n -= cost; n > 0 {
			sh.pending[k] = n
		} else {
			delete(sh.pending, k)
		}
	}
}

// Settle is Refund: it settles the refunds that carry Settle to their
// amounts (stores.Settler).
func (s *Store) Settle(ctx context.Context, refunds []algorithms.Refund) error {
	return s.Refund(ctx, refunds)
}
