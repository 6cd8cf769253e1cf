// Package sluice is a Caddy v2 HTTP handler module, the rate_limit
// directive: per-zone rate limits keyed by client, enforced exactly and
// atomically in an embedded in-memory store or, for a fleet, in a shared
// store.
package sluice

import (
	// The stores: the embedded default and the shared Redis store.
	_ "github.com/sluicehq/caddy-sluice/memstore"
	_ "github.com/sluicehq/caddy-sluice/redisstore"
)
