package redisstore

import (
	"context"
	"slices"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Refunds: a zone that counts only some response statuses (the handler's
// `count`) is charged before the request runs and given its charge back
// when the response does not match. The give-back is a script call in
// refund mode (lua/take.lua; its Go twin is algorithms.GiveBack), one per
// Cluster hash slot of the refunded keys (one in all on a single server), which
// the pipeline workers send like any decision: it shares a round trip with
// the decisions in flight. Nobody waits for it: Refund returns at once, so
// a refund never delays a response.
//
// A refund that cannot be sent, or fails, is lost: the charge stays, the
// key shows it until it refills (the limiter's favour, never the client's),
// and caddy_rate_limit_store_refunds_lost_total counts it. So are the
// refunds posted while the circuit breaker is open (Redis is not called),
// when the workers' queue is full, or whose timeout passes before a worker
// sends them; and, at shutdown, those still queued.
//
// The deny cache never answers a refusal that rests on a refundable zone's
// bucket (denycache: a refund, here or on another instance, can lift it),
// so refunds need not reach the cache.

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
	s.holds.Add(1) // until refundCallDone
	if b := n.breaker; b != nil && b.state.Load() != circuitClosed || !n.batch.post(c) {
		s.holds.Add(-1)
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
	c.argv = s.argc.appendRefunds(c.argv, refunds)
	return c
}

// refundDone counts a refund call's refunds (one per key) as lost when it
// was never sent or failed. It is bound once (Store.refundDone), so a
// refund allocates no closure.
func (s *Store) refundCallDone(c *call) {
	if c.cmd == nil || c.replyErr() != nil {
		s.refundsLost.Add(float64(c.nkeys))
	}
	s.holds.Add(-1)
}

// Hold marks a request that may still call the store (its charges in
// flight to settle, a wait for others'); Unhold ends it. The store a
// reload replaces stays open while any is held (Redis.Cleanup).
func (s *Store) Hold() { s.holds.Add(1) }

// Unhold ends a Hold.
func (s *Store) Unhold() { s.holds.Add(-1) }

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
