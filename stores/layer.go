package stores

import (
	"context"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// TakeFunc is a Take as a function: a Store.
type TakeFunc func(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error

// Take calls f.
func (f TakeFunc) Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
	return f(ctx, reqs, out)
}

// Layer wraps the Take below it: it may answer without calling next (a
// cache), refuse to call it (a breaker), call it for part of a request (a
// local allowance), or watch what it answers (a recorder). It keeps Take's
// contract: all-or-nothing, out sized by the caller, no allocation per call.
type Layer func(next Store) Store

// Stack composes layers over bottom, the first layer on top: Stack(b, x, y)
// is x(y(b)). It runs once, at Provision.
func Stack(bottom Store, layers ...Layer) Store {
	s := bottom
	for i := len(layers) - 1; i >= 0; i-- {
		s = layers[i](s)
	}
	return s
}
