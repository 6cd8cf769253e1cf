package redisstore

import (
	"context"
	"slices"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Refunds: a charge given back after its decision (a count zone's
// uncounted status, a waiter called off, a fail-local give-back) or
// settled to its actual amount (a settle zone: Settle), and a charge in
// flight made final (Keep): the script in its refund and settle modes
// (lua/take.lua; Go twins algorithms.GiveBack and algorithms.Settle), one
// call per hash slot of the keys, sent by the pipeline workers like a
// decision. Nobody waits for it. A refund not sent, or failed, is lost
// (the limiter's favour) and counted (refundsLost). docs/redis.md, "Refunds".

// Refund gives back charges without waiting (see above). It never fails:
// a lost refund is counted. A concurrency zone has no charge to give back
// (its slot goes back by Release): its refunds are ignored.
func (s *Store) Refund(_ context.Context, refunds []algorithms.Refund) error {
	refunds = rateRefunds(refunds)
	if len(refunds) == 0 {
		return nil
	}
	if !s.cluster || refundsInOneHashSlot(refunds) {
		s.postRefunds(refunds)
		return nil
	}
	groups := map[uint16][]algorithms.Refund{}
	for _, r := range refunds {
		sl := hashSlotOf(r.Key)
		groups[sl] = append(groups[sl], r)
	}
	for _, g := range groups {
		s.postRefunds(g)
	}
	return nil
}

// rateRefunds returns refunds without those of concurrency zones (none
// reach here from the handler; when some do, the caller's slice is
// compacted in place).
func rateRefunds(refunds []algorithms.Refund) []algorithms.Refund {
	for i := range refunds {
		if refunds[i].Limit.Algorithm == algorithms.Concurrency {
			return slices.DeleteFunc(refunds, func(r algorithms.Refund) bool { return r.Limit.Algorithm == algorithms.Concurrency })
		}
	}
	return refunds
}

// postRefunds hands one script call giving back refunds (all in one hash slot)
// to the pipeline workers of their node, unless its breaker is open.
func (s *Store) postRefunds(refunds []algorithms.Refund) {
	c := s.refundCall(refunds)
	c.onDone = s.refundDone
	n := s.nodeFor(c.ctx, c.key0())
	s.pins.Add(1) // until refundCallDone
	if b := n.breaker; b != nil && b.state.Load() != circuitClosed || !n.batch.post(c) {
		s.pins.Add(-1)
		s.refundsLost.Add(float64(len(refunds)))
		putCall(c)
	}
}

// refundCall returns the script call that gives back refunds (all in one
// slot).
func (s *Store) refundCall(refunds []algorithms.Refund) *call {
	c := getCall(context.Background(), time.Now().Add(s.timeout))
	c.setKeysBy(len(refunds), func(b []byte, i int) []byte {
		return s.appendKey(b, refunds[i].Zone, refunds[i].Key)
	})
	c.addArgsBy(len(refunds), func(b []byte, i int) []byte { return s.argc.appendRefund(b, &refunds[i]) })
	return c
}

// refundDone counts a refund call's refunds (one per key) as lost when it
// was never sent or failed. It is bound once (Store.refundDone), so a
// refund allocates no closure.
func (s *Store) refundCallDone(c *call) {
	if c.cmd == nil || c.replyErr() != nil {
		s.refundsLost.Add(float64(c.nkeys))
	}
	s.pins.Add(-1)
}

// Pin marks a request that may still call the store (its charges in
// flight to settle, a wait for others'); Unpin ends it. The store a
// reload replaces stays open while any pins it (Redis.Cleanup).
func (s *Store) Pin() { s.pins.Add(1) }

// Unpin ends a Pin.
func (s *Store) Unpin() { s.pins.Add(-1) }

// post queues an asynchronous call (c.onDone set) without waiting; it
// reports false when the queue is full (c is then the caller's).
func (b *batcher) post(c *call) bool {
	select {
	case b.queue <- c:
		return true
	default:
		return false
	}
}

// refundsInOneHashSlot reports whether the keys of refunds live in one Cluster
// slot.
func refundsInOneHashSlot(refunds []algorithms.Refund) bool {
	first := hashSlotOf(refunds[0].Key)
	for i := 1; i < len(refunds); i++ {
		if refunds[i].Key != refunds[0].Key && hashSlotOf(refunds[i].Key) != first {
			return false
		}
	}
	return true
}

// Refund implements the store's refund (see Store.Refund).
func (r *Redis) Refund(ctx context.Context, refunds []algorithms.Refund) error {
	if r.Store == nil {
		return nil
	}
	return r.Store.Refund(ctx, refunds)
}

// Settle is Refund: its refunds that carry Settle are settled to their
// amounts by the script (mode 10, lua/settle.lua), queued like the others
// (stores.Settler).
func (s *Store) Settle(ctx context.Context, refunds []algorithms.Refund) error {
	return s.Refund(ctx, refunds)
}

// Settle implements the store's settle (see Store.Settle).
func (r *Redis) Settle(ctx context.Context, refunds []algorithms.Refund) error {
	return r.Refund(ctx, refunds)
}
