// Package sluice is a Caddy v2 HTTP handler module, the rate_limit
// directive: per-zone rate limits keyed by client, enforced exactly and
// atomically in an embedded memory store or a shared Redis store.
//
// One request is one admission (admission.go) that Handler.ServeHTTP
// (handler.go) runs top to bottom: plan (the zones that apply, each one's
// key, limit and cost), decide (one Store.Take for every zone, all or
// nothing, inside the fail policy: failpolicy.go), verdict (the decisions
// ranked; a refusal answered by package reply), serve and forward (the
// next handlers, the response's status and body noted by statuswriter.go),
// then the obligations: what the request gives back (one reservation whose
// charges each carry their control's giver, reservation.go) and the exit
// hooks. Each control lives in its own file, registered by one line in the
// controls table (controls.go); the runtime zone is zone.go's.
//
// docs/architecture.md has the diagram, the store's layers, where each
// control plugs in, and the function hops of one request.
package sluice

import (
	// The stores: the embedded default and the shared Redis store.
	_ "github.com/sluicehq/caddy-sluice/memstore"
	_ "github.com/sluicehq/caddy-sluice/redisstore"
)
