package sluice

import (
	"context"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Store is the contract between the handler and a state store (a guest
// module in the http.handlers.rate_limit.stores namespace). Stores satisfy it
// structurally and never import this package.
//
// Take decides every zone of one request in one call: if every request is
// allowed, all are charged; if any is refused, none is charged. A refusal
// never consumes. It writes one decision per request into out, which the
// caller sizes to len(reqs) (an out parameter, not a returned slice, so the
// hot path allocates nothing). An error means the store could not decide;
// out is then meaningless, except for an *algorithms.PartialError: the
// zones it does not mark failed (all FailApart) were decided and charged.
type Store interface {
	Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error
}

// keyedStore is implemented by stores whose configuration has an identity:
// two handlers whose stores report the same key share state.
type keyedStore interface {
	Key() string
}
