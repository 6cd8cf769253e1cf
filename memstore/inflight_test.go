package memstore

import (
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/algorithms/vectortest"
)

// Charges in flight in memory (algorithms/inflight.go).
func TestInFlight(t *testing.T) {
	s := New(Config{SweepInterval: -1})
	defer s.Close()
	n := 0
	vectortest.InFlight(t, s, func() algorithms.Key { n++; return keyOf(n) })
}
