package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/stores"
)

// TestOOMStillRefuses: under noeviction with its memory full, Redis
// refuses every write; a key over its limit is still refused by Redis (the
// read-only function on the FCALL path; the EVALSHA script, which Redis
// runs until its first write), with no error, while a request that would
// be admitted (a write) fails with the error kind oom for the fail policy.
func TestOOMStillRefuses(t *testing.T) {
	srv := redistest.Start(t)
	for name, url := range map[string]string{
		"FCALL":   srv.URL(),
		"EVALSHA": srv.User(t, "oom-nofn", "~*", "+@all", "-function", "-fcall", "-fcall_ro"),
	} {
		t.Run(name, func(t *testing.T) {
			srv.ClearOOM(t)
			s := newTestStore(t, url, "", testTimeout, 0)
			over := algorithms.Request{Zone: "oom", Key: freshKey(t), Limit: limit(t, 3, time.Hour, 0), Cost: 1}
			for i := range 4 {
				if got := take(t, s, over)[0].Allowed; got != (i < 3) {
					t.Fatalf("before OOM, take %d: allowed %v", i, got)
				}
			}
			srv.FillMemory(t)
			for i := range 10 {
				out := make([]algorithms.Decision, 1)
				if err := s.Take(context.Background(), []algorithms.Request{over}, out); err != nil || out[0].Allowed {
					t.Fatalf("OOM, a key over its limit, take %d: allowed %v, error %v; want refused by Redis", i, out[0].Allowed, err)
				}
				fresh := algorithms.Request{Zone: "oom", Key: freshKey(t), Limit: over.Limit, Cost: 1}
				err := s.Take(context.Background(), []algorithms.Request{fresh}, out)
				var k stores.ErrorKind
				if !errors.As(err, &k) || k.StoreErrorKind() != "oom" {
					t.Fatalf("OOM, a fresh key: %v; want an error of kind oom", err)
				}
			}
		})
	}
}

// TestOOMKeepsDenyCache: a decision that fails for memory does not clear
// the deny cache (Redis's state stands): a refusal it holds is still
// answered locally, without a call to Redis.
func TestOOMKeepsDenyCache(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := observedStore(t, srv.URL())
	waitArmed(t, s)
	over := algorithms.Request{Zone: "oomdeny", Key: freshKey(t), Limit: limit(t, 2, time.Hour, 0), Cost: 1}
	for i := range 3 {
		if got := take(t, s, over)[0].Allowed; got != (i < 2) {
			t.Fatalf("take %d: allowed %v", i, got)
		}
	}
	srv.FillMemory(t)
	fresh := algorithms.Request{Zone: "oomdeny", Key: freshKey(t), Limit: over.Limit, Cost: 1}
	if err := s.Take(context.Background(), []algorithms.Request{fresh}, make([]algorithms.Decision, 1)); err == nil {
		t.Fatal("a fresh key's admission under OOM did not fail")
	}
	hits := testutil.ToFloat64(s.denyHits)
	if take(t, s, over)[0].Allowed {
		t.Fatal("the client over its limit was admitted")
	}
	if got := testutil.ToFloat64(s.denyHits) - hits; got != 1 {
		t.Fatalf("%v deny cache hits after an OOM failure, want 1 (the cache kept the refusal)", got)
	}
}
