package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestClusterRequestSpanningShards: a request whose zones' keys live on two
// shards, one of them frozen (SIGSTOP: its calls time out, then its breaker
// opens). Zone A's shard is healthy, zone B's is down.
//
//   - B FailApart (fail open, or local): A is decided by Redis, alone: of
//     24 concurrent requests exactly A's limit are admitted (the others
//     refused by A), B is marked failed (PartialError) for its policy.
//   - B not FailApart (fail closed): the request fails as a whole, and A
//     is not charged.
func TestClusterRequestSpanningShards(t *testing.T) {
	c := redistest.StartClusterWith(t, redistest.ClusterConfig{Masters: 3, NodeTimeout: 30 * time.Second, Partial: true})
	const timeout = 200 * time.Millisecond // above a busy -race machine's noise
	s := newClusterStore(t, c.Addrs(), timeout)
	const healthy, down, lim = 0, 1, 5
	zone := func(name string, key algorithms.Key, failOpen bool) algorithms.Request {
		return algorithms.Request{Zone: name, Key: key, Limit: limit(t, lim, time.Hour, 0), Cost: 1, FailApart: failOpen}
	}
	// Both shards known to the store before the freeze.
	a, b := keyOnNode(t, s, c, healthy), keyOnNode(t, s, c, down)
	take(t, s, zone("warm", a, false))
	take(t, s, zone("warm", b, false))
	c.Nodes[down].Freeze(t)
	defer c.Nodes[down].Thaw(t)

	const workers, each = 8, 3
	run := func(reqs []algorithms.Request) (admitted, refused, partial, whole int64, other []error) {
		var ad, rf, pa, wh atomic.Int64
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]algorithms.Decision, len(reqs))
				for range each {
					err := s.Take(context.Background(), reqs, out)
					var pe *algorithms.PartialError
					switch {
					case err == nil && !out[0].Allowed:
						rf.Add(1)
					case errors.As(err, &pe) && len(pe.Failed) == 2 && !pe.Failed[0] && pe.Failed[1]:
						pa.Add(1)
						if out[0].Allowed {
							ad.Add(1)
						}
					case err != nil && !errors.As(err, &pe):
						wh.Add(1)
					default:
						mu.Lock()
						other = append(other, err)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		return ad.Load(), rf.Load(), pa.Load(), wh.Load(), other
	}

	t.Run("down zone apart", func(t *testing.T) {
		reqs := []algorithms.Request{zone("a", keyOnNode(t, s, c, healthy), false), zone("b", b, true)}
		admitted, refused, partial, whole, other := run(reqs)
		t.Logf("%d admitted, %d refused by A, %d decided in part, %d failed whole, other %v", admitted, refused, partial, whole, other)
		if admitted != lim || refused != workers*each-lim || whole != 0 || len(other) != 0 {
			t.Errorf("of %d requests: %d admitted, %d refused, %d failed whole, other outcomes %v; want A's limit %d admitted, the rest refused by A",
				workers*each, admitted, refused, whole, other, lim)
		}
	})

	t.Run("down zone not apart", func(t *testing.T) {
		ka := keyOnNode(t, s, c, healthy)
		reqs := []algorithms.Request{zone("a", ka, true), zone("b", b, false)}
		admitted, refused, partial, whole, other := run(reqs)
		t.Logf("%d admitted, %d refused, %d decided in part, %d failed whole, other %v", admitted, refused, partial, whole, other)
		if whole != workers*each {
			t.Errorf("of %d requests %d failed whole (%d decided in part, %d refused, other %v); want all", workers*each, whole, partial, refused, other)
		}
		// A, charged by each request and refunded, has its whole limit.
		out := make([]algorithms.Decision, 1)
		if err := s.Take(context.Background(), reqs[:1], out); err != nil || !out[0].Allowed || out[0].Remaining != lim-1 {
			t.Errorf("A alone after the failed requests: %+v, %v; want allowed with %d remaining (nothing charged before)", out[0], err, lim-1)
		}
	})
}
