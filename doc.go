// Package sluice is a Caddy v2 HTTP handler module, the rate_limit
// directive: per-zone rate limits keyed by client, enforced exactly and
// atomically in an embedded memory store or a shared Redis store.
//
// One request is one admission (admission.go), whose stages
// Handler.ServeHTTP (handler.go) runs top to bottom:
//
//   - plan: the zones whose matchers match, each one's key token
//     (identity), limit and cost (limits.go), as one algorithms.Request.
//   - take: one Store.Take (store.go) decides every zone at once, all or
//     nothing; the fail policy (failpolicy.go) is the layer around it that
//     applies each zone's fail open, closed or local when the store fails.
//   - verdict: the decisions ranked (reply.Standing); a refusal is
//     answered (refuse.go, package reply); an allowed request gets its
//     headers (reply.Shape.SetLimitHeaders).
//   - serve: the marks of on_exceed pass, a delay's wait for its turn.
//   - forward: the next handlers; when the response's status is known, a
//     count zone's charge is settled (statuswriter.go).
//   - exit: on every exit, the concurrency slots go back.
//
// What a request gives back (a count refund, a departed waiter's charges,
// its slots) is one reservation (reservation.go), given back once into the
// store that decided.
//
// Each control (count, on_exceed pass, delay, charges in flight,
// concurrency, penalty) lives in its own file, registered by one line in
// the controls table (controls.go); at Provision it says which stages it
// joins, and only those hooks run.
//
// docs/architecture.md has the diagram, the store's layers, where each
// control plugs in, and the function hops of one request.
package sluice

import (
	// The stores: the embedded default and the shared Redis store.
	_ "github.com/sluicehq/caddy-sluice/memstore"
	_ "github.com/sluicehq/caddy-sluice/redisstore"
)
