package vectortest

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// InFlightStore is what InFlight runs against: a store's Take and Refund.
type InFlightStore interface {
	Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error
	Refund(ctx context.Context, refunds []algorithms.Refund) error
}

// InFlight checks a store's charges in flight (algorithms/inflight.go)
// for every algorithm: a key of 3 with a penalty, three charges in
// flight; a fourth request is refused resting on them (InFlight, no
// penalty); one given back admits it; once every charge is settled and
// kept, a refusal no longer rests on anything in flight and starts the
// penalty. s.Refund must have given back when it returns. key returns a
// fresh key.
func InFlight(t *testing.T, s InFlightStore, key func() algorithms.Key) {
	algs := []algorithms.Algorithm{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.SlidingLog}
	for _, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			l, err := algorithms.NewLimit(alg, 3, time.Hour, 0)
			if err != nil {
				t.Fatal(err)
			}
			l.Penalty = 2 * time.Hour.Milliseconds()
			zone, k := "inflight_"+alg.String(), key()
			r := algorithms.Request{Zone: zone, Key: k, Limit: l, Cost: 1, Refundable: true, InFlight: true}
			take := func(what string) algorithms.Decision {
				t.Helper()
				out := make([]algorithms.Decision, 1)
				if err := s.Take(context.Background(), []algorithms.Request{r}, out); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				return out[0]
			}
			settle := func(d algorithms.Decision, keep bool) {
				t.Helper()
				rf := algorithms.Refund{Zone: zone, Key: k, Limit: l, Cost: 1, At: d.At, InFlight: true, Keep: keep}
				if err := s.Refund(context.Background(), []algorithms.Refund{rf}); err != nil {
					t.Fatal(err)
				}
			}
			var charged []algorithms.Decision
			for i := range 3 {
				d := take("charge")
				if !d.Allowed {
					t.Fatalf("charge %d: %+v, want allowed", i, d)
				}
				charged = append(charged, d)
			}
			if d := take("the fourth"); d.Allowed || !d.InFlight || d.RetryAfter >= 2*time.Hour {
				t.Fatalf("the fourth, three charges in flight: %+v; want refused, resting on them, no penalty", d)
			}
			settle(charged[0], false) // its status was not counted
			d := take("after one given back")
			if !d.Allowed {
				t.Fatalf("after one charge given back: %+v, want allowed", d)
			}
			charged = append(charged[1:], d)
			if d := take("the fifth"); d.Allowed || !d.InFlight {
				t.Fatalf("three charges in flight again: %+v; want refused, resting on them", d)
			}
			for _, c := range charged {
				settle(c, true) // counted: kept
			}
			if d := take("all kept"); d.Allowed || d.InFlight || d.RetryAfter < 119*time.Minute {
				t.Fatalf("every charge settled and kept: %+v; want refused, the penalty started", d)
			}
		})
	}
}
