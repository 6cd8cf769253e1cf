package redisstore

import (
	"context"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/stores"
)

// stack composes the store's Take at its creation, in the order a decision
// meets the layers (docs/redis.md, "Layers"):
//
//	asynchronous     a zone in the mode decided here, synced later (async.go)
//	local allowance  a hot key's grant spent here (allowance.go)
//	deny cache       a refusal Redis would repeat, answered here (denycache)
//	nodes            Redis: per node of the key (s.call, nodeStack):
//	  breaker        fails at once while the node is failing (breaker.go)
//	  pipeline       the node's workers send the script call (batch.go)
func (s *Store) stack() {
	s.call = s.nodeStack()
	s.top = stores.Stack(stores.TakeFunc(s.takeNodes),
		s.asyncLayer,
		s.allowanceLayer,
		s.denyLayer,
	)
}

// nodeCall runs one script call c, its keys in one hash slot, on node n:
// the shape of the layers below the choice of a node. It consumes c, and
// fills ref with a refusal's states when ref is not nil.
type nodeCall func(n *node, c *call, reqs []algorithms.Request, out []algorithms.Decision, ref *refusal) error

// nodeStack composes a node's layers: its breaker over its pipeline.
func (s *Store) nodeStack() nodeCall {
	return s.breakerLayer(s.pipelined)
}

// allowanceLayer decides a request from local allowances when one of its
// zones has one (takeAllowance), and passes the rest, with the units it
// draws, to next.
func (s *Store) allowanceLayer(next stores.Store) stores.Store {
	return stores.TakeFunc(func(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
		if a := s.allow.Load(); a != nil {
			if cfgs := a.zones.Load(); cfgs != nil && a.uses(*cfgs, reqs) {
				return s.takeAllowance(ctx, next, *cfgs, reqs, out)
			}
		}
		return next.Take(ctx, reqs, out)
	})
}

// denyLayer answers a request from the deny cache when its keys were
// refused moments ago and their states, run forward, still refuse it
// (denied); next decides the others, and feeds the cache its refusals
// (takeNodes). Without a cache it is no layer.
func (s *Store) denyLayer(next stores.Store) stores.Store {
	if s.deny == nil {
		return next
	}
	return stores.TakeFunc(func(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
		if s.deny.Active() && s.denied(reqs, out) {
			return nil
		}
		return next.Take(ctx, reqs, out)
	})
}

// breakerLayer puts n's breaker in front of next: while it is open, a call
// fails at once with its error (*circuitError, wrapping ErrCircuitOpen),
// and the outcome of every call let through is counted by the breaker.
func (s *Store) breakerLayer(next nodeCall) nodeCall {
	return func(n *node, c *call, reqs []algorithms.Request, out []algorithms.Decision, ref *refusal) error {
		probe, err := n.breaker.allow()
		if err != nil {
			putCall(c)
			s.nodeFailed(n)
			return err
		}
		ctx := c.ctx
		err = next(n, c, reqs, out, ref)
		// The caller gone (its context done first, not by the decision's
		// own deadline) says nothing about Redis.
		abandoned := err != nil && ctx.Err() != nil && context.Cause(ctx) != errDecisionDeadline
		failed := err != nil && !abandoned && counts(err)
		n.breaker.done(probe, failed, abandoned, err)
		if failed {
			n.failures.Add(1)
			n.failuresCtr.Inc()
			s.nodeFailed(n)
		}
		return err
	}
}

// pipelined sends c through n's pipeline workers and decodes its reply.
func (s *Store) pipelined(n *node, c *call, reqs []algorithms.Request, out []algorithms.Decision, ref *refusal) error {
	return s.runCall(n.batch, c, reqs, out, false, ref)
}

// failedFast reports whether err is a breaker's (breakerLayer), failed at
// once without calling Redis.
func failedFast(err error) bool {
	_, ok := err.(*circuitError)
	return ok
}
