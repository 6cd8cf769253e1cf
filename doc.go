// Package sluice is a Caddy v2 HTTP handler module, the rate_limit
// directive: per-zone rate limits keyed by client, enforced exactly and
// atomically in an embedded memory store or a shared Redis store.
//
// A request, in four stages:
//   - Plan: Handler.ServeHTTP calls decide (handler.go), which keeps the
//     zones whose matchers match, derives each key's token (identity) and
//     resolves each zone's limit and cost (limits.go).
//   - Take: one Store.Take (store.go) decides every zone at once, all or
//     nothing; on an error, failover applies each zone's fail policy.
//   - Verdict: pick ranks the decisions (rank.go); refuse answers a
//     refusal (response.go); an admitted request gets its headers
//     (headers.go) and pass marks (pass.go), and may wait for its turn
//     (delay.go) or for charges in flight (inflight.go).
//   - Obligations: serveAfter (after.go) learns the status and the count
//     zones give back what it does not count (count.go); on every exit
//     after.done releases the concurrency slots (concurrency.go).
//
// docs/architecture.md has the diagrams, the store's layers, where each
// control plugs in, and the function hops of one request.
package sluice

import (
	// The stores: the embedded default and the shared Redis store.
	_ "github.com/sluicehq/caddy-sluice/memstore"
	_ "github.com/sluicehq/caddy-sluice/redisstore"
)
