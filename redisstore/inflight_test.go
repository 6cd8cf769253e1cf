package redisstore

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/algorithms/vectortest"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// Charges in flight in Redis (algorithms/inflight.go, lua/take.lua): the
// same scenario as in memory; and the counter is gone once every charge
// is settled.
func TestInFlight(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	vectortest.InFlight(t, refundWaiting{s, t}, func() algorithms.Key { return freshKey(t) })
	for _, k := range scanAll(t, srv) {
		if strings.HasSuffix(k, ":f") {
			t.Errorf("%s left behind once every charge settled", k)
		}
	}
}

// refundWaiting is a Store whose Refund waits until Redis has run it.
type refundWaiting struct {
	*Store
	t *testing.T
}

func (s refundWaiting) Refund(_ context.Context, refunds []algorithms.Refund) error {
	refundAndWait(s.t, s.Store, refunds)
	return nil
}

// The same on a Redis Cluster: the counter KEYS[i]:f shares its state
// key's hash tag, so its slot.
func TestInFlightCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := newClusterStore(t, c.Addrs(), testTimeout)
	vectortest.InFlight(t, refundWaiting{s, t}, func() algorithms.Key { return freshKey(t) })
}
