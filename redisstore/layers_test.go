package redisstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/memstore"
	"github.com/sluicehq/caddy-sluice/stores"
)

// counted is next with its calls counted: what a layer let through.
func counted(next stores.TakeFunc, calls *atomic.Int64) stores.Store {
	return stores.TakeFunc(func(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
		calls.Add(1)
		return next(ctx, reqs, out)
	})
}

// TestDenyLayerAlone: the deny cache layer over the nodes answers a
// refused key's next requests itself (next not called), refused as Redis
// refused it, and lets another key through.
func TestDenyLayerAlone(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 1000)
	var calls atomic.Int64
	layer := s.denyLayer(counted(s.takeNodes, &calls))
	l := limit(t, 1, time.Hour, 0)
	req := []algorithms.Request{{Zone: "dl", Key: freshKey(t), Limit: l, Cost: 1}}
	out := make([]algorithms.Decision, 1)
	ctx := context.Background()
	for i, want := range []bool{true, false} {
		if err := layer.Take(ctx, req, out); err != nil || out[0].Allowed != want {
			t.Fatalf("take %d: %v %+v, want allowed %v", i, err, out[0], want)
		}
	}
	if calls.Load() != 2 {
		t.Fatalf("%d calls below for the first two takes, want 2", calls.Load())
	}
	for i := range 50 {
		if err := layer.Take(ctx, req, out); err != nil || out[0].Allowed || out[0].RetryAfter <= 0 {
			t.Fatalf("refusal %d: %v %+v, want refused with a Retry-After", i, err, out[0])
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls below after 50 refusals of a refused key, want 2 (the layer answers)", n)
	}
	other := []algorithms.Request{{Zone: "dl", Key: freshKey(t), Limit: l, Cost: 1}}
	if err := layer.Take(ctx, other, out); err != nil || !out[0].Allowed || calls.Load() != 3 {
		t.Fatalf("another key: %v %+v after %d calls, want allowed by the layer below", err, out[0], calls.Load())
	}
}

// TestDenyLayerOffIsNoLayer: a store without a deny cache stacks nothing.
func TestDenyLayerOffIsNoLayer(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 0)
	mem := memstore.New(memstore.Config{MaxKeys: 64})
	defer mem.Close()
	if got := s.denyLayer(mem); got != stores.Store(mem) {
		t.Fatalf("denyLayer without a cache = %T, want next itself", got)
	}
}

// TestAllowanceLayerAlone: the local allowance layer over the nodes
// decides a hot key's requests from its grants, calling the layer below
// for a few of them only; a zone without an allowance goes below every
// time.
func TestAllowanceLayerAlone(t *testing.T) {
	srv := redistest.Start(t)
	l := limit(t, 1000, time.Hour, 0)
	s := allowanceStore(t, srv.URL(), "al", l, time.Second)
	var calls atomic.Int64
	layer := s.allowanceLayer(counted(s.takeNodes, &calls))
	ctx := context.Background()
	out := make([]algorithms.Decision, 1)
	hot := []algorithms.Request{{Zone: "al", Key: freshKey(t), Limit: l, Cost: 1}}
	for i := range 300 {
		if err := layer.Take(ctx, hot, out); err != nil || !out[0].Allowed {
			t.Fatalf("request %d: %v %+v, want allowed", i, err, out[0])
		}
	}
	t.Logf("300 requests of a hot key: %d calls below", calls.Load())
	if n := calls.Load(); n == 0 || n > 30 {
		t.Fatalf("%d calls below for 300 requests of a hot key, want 1 to 30", n)
	}
	calls.Store(0)
	plain := []algorithms.Request{{Zone: "other", Key: freshKey(t), Limit: l, Cost: 1}}
	for range 20 {
		if err := layer.Take(ctx, plain, out); err != nil || !out[0].Allowed {
			t.Fatalf("zone without an allowance: %v %+v", err, out[0])
		}
	}
	if n := calls.Load(); n != 20 {
		t.Fatalf("%d calls below for 20 requests of a zone without an allowance, want 20", n)
	}
}

// TestBreakerLayerAlone: a node's breaker over its pipeline lets calls
// through while Redis answers; once Redis is gone, after the threshold of
// failures it fails every call at once (ErrCircuitOpen) without calling the
// pipeline.
func TestBreakerLayerAlone(t *testing.T) {
	srv := redistest.Start(t)
	s := storeAt(t, srv.URL(), testTimeout, breakerOpts(3, time.Hour, time.Hour))
	var calls atomic.Int64
	call := s.breakerLayer(func(n *node, c *call, reqs []algorithms.Request, out []algorithms.Decision, ref *refusal) error {
		calls.Add(1)
		return s.pipelined(n, c, reqs, out, ref)
	})
	reqs := []algorithms.Request{{Zone: "bl", Key: freshKey(t), Limit: limit(t, 100, time.Hour, 0), Cost: 1}}
	out := make([]algorithms.Decision, 1)
	once := func() error {
		c := getCall(context.Background(), time.Now().Add(testTimeout))
		c.fresh = true
		c.setKeys(s, reqs)
		return call(s.one, c, reqs, out, nil)
	}
	if err := once(); err != nil || !out[0].Allowed || calls.Load() != 1 {
		t.Fatalf("Redis up: %v %+v after %d calls, want allowed through the pipeline", err, out[0], calls.Load())
	}
	srv.Stop()
	for i := range 3 {
		if err := once(); err == nil || failedFast(err) {
			t.Fatalf("failure %d: %v, want the pipeline's error", i, err)
		}
	}
	for i := range 10 {
		if err := once(); !failedFast(err) || !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("call %d after 3 failures: %v, want the open breaker's", i, err)
		}
	}
	if n := calls.Load(); n != 4 {
		t.Fatalf("%d pipeline calls, want 4 (1 allowed, 3 failed; none once open)", n)
	}
}
