package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/stores"
)

func setOv(t *testing.T, s *Store, zone string, key algorithms.Key, o algorithms.Override, maxN int) error {
	t.Helper()
	return s.SetOverride(testCtx(t), zone, stores.OverrideEntry{Key: key, Override: o, Reason: "r", By: "127.0.0.1:9", At: time.Now().UnixMilli()}, maxN)
}

// Two stores on one Redis (two instances): an override set through one
// decides the other's next take of the key, with no reload and no poll
// between; a refusal made under an override is not kept by the deny cache
// (a delete through the other instance admits the key at once); the key's
// peek shows the overridden limit; the zone's bound holds; Redis ends an
// override at its expiry (its PXAT) and the listing hands it, once, to
// the caller that collects it.
func TestOverridesAcrossStores(t *testing.T) {
	srv := redistest.Start(t)
	a, b := denyStore(t, srv, 1000), denyStore(t, srv, 1000)
	ctx := context.Background()
	l := limit(t, 2, time.Hour, 0)
	zone, key := "ovz", freshKey(t)
	r := algorithms.Request{Zone: zone, Key: key, Limit: l, Cost: 1}
	take(t, b, r)
	take(t, b, r)
	exp := time.Now().Add(time.Hour).UnixMilli()
	if err := setOv(t, a, zone, key, algorithms.Override{Events: 5, Window: l.Window, Expires: exp}, 10); err != nil {
		t.Fatal(err)
	}
	if d := take(t, b, r)[0]; !d.Allowed || !d.Overridden || d.Limit != 5 || d.Remaining != 2 {
		t.Fatalf("the other instance under the raised limit: %+v, want allowed, limit 5, 2 left", d)
	}
	out, found := make([]algorithms.Decision, 1), make([]bool, 1)
	if err := b.PeekKeys(ctx, zone, []algorithms.Key{key}, l, out, found); err != nil || out[0].Limit != 5 || out[0].Remaining != 2 || !out[0].Overridden {
		t.Fatalf("peek under the override: %+v %v", out[0], err)
	}
	// blocked: refused by b, and not cached there
	if err := setOv(t, a, zone, key, algorithms.Override{Block: true, Expires: exp}, 10); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if d := take(t, b, r)[0]; d.Allowed || d.Limit != 0 || d.RetryAfter < 59*time.Minute {
			t.Fatalf("blocked: %+v", d)
		}
	}
	if err := setOv(t, a, zone, key, algorithms.Override{Unlimited: true, Expires: exp}, 10); err != nil {
		t.Fatal(err)
	}
	if d := take(t, b, r)[0]; !d.Allowed || !d.Overridden {
		t.Fatalf("unlimited right after the block, on the instance that refused under it: %+v", d)
	}
	if _, ok, err := a.DeleteOverride(ctx, zone, key); !ok || err != nil {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if d := take(t, b, r)[0]; d.Allowed || d.Overridden || d.Limit != 2 {
		t.Fatalf("after the delete (3 spent of 2): %+v, want refused under the zone's limit", d)
	}

	// a refusal a's deny cache holds ends when a sets an override
	k3 := freshKey(t)
	r3 := algorithms.Request{Zone: "ovdeny", Key: k3, Limit: l, Cost: 1}
	for i := range 4 {
		if d := take(t, a, r3)[0]; d.Allowed != (i < 2) {
			t.Fatalf("take %d of a limit of 2: %+v", i+1, d)
		}
	}
	calls := scriptCalls(t, srv)
	take(t, a, r3)
	if scriptCalls(t, srv) != calls {
		t.Fatal("the refused key was not answered by the deny cache")
	}
	if err := setOv(t, a, "ovdeny", k3, algorithms.Override{Events: 10, Window: l.Window, Expires: exp}, 10); err != nil {
		t.Fatal(err)
	}
	if d := take(t, a, r3)[0]; !d.Allowed || !d.Overridden {
		t.Fatalf("right after the override, on the instance that cached the refusal: %+v", d)
	}

	// the bound
	if err := setOv(t, a, zone, freshKey(t), algorithms.Override{Block: true, Expires: exp}, 1); err != nil {
		t.Fatal(err)
	}
	if err := setOv(t, a, zone, freshKey(t), algorithms.Override{Block: true, Expires: exp}, 1); !errors.Is(err, stores.ErrTooManyOverrides) {
		t.Fatalf("a second of 1: %v", err)
	}

	// expiry, by Redis
	k2 := freshKey(t)
	if err := setOv(t, a, "ovexp", k2, algorithms.Override{Block: true, Expires: time.Now().Add(300 * time.Millisecond).UnixMilli()}, 10); err != nil {
		t.Fatal(err)
	}
	r2 := algorithms.Request{Zone: "ovexp", Key: k2, Limit: l, Cost: 1}
	okey := a.overrideKey("ovexp", k2)
	if pttl(t, srv.Client(), okey) <= 0 {
		t.Fatalf("the override's key %s has no TTL", okey)
	}
	for start := time.Now(); srv.Client().Exists(ctx, okey).Val() == 1; time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the override's key outlived its expiry by 10s")
		}
	}
	if d := take(t, b, r2)[0]; !d.Allowed || d.Overridden {
		t.Fatalf("after the expiry: %+v", d)
	}
	live, expired, err := a.Overrides(ctx, "ovexp")
	if err != nil || len(live) != 0 || len(expired) != 1 || expired[0].Key != k2 || !expired[0].Block {
		t.Fatalf("the listing after the expiry: %v %v %v", live, expired, err)
	}
	if _, expired, _ := b.Overrides(ctx, "ovexp"); len(expired) != 0 {
		t.Fatalf("the expiry handed out twice: %v", expired)
	}
}

// In a Cluster: each key's override lives in its key's slot (one script
// call decides with it), the zone's index in its own; a request of two
// zones of one key, one overridden, is one call; the listing and the
// delete reach both.
func TestOverridesCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := newClusterStore(t, c.Addrs(), testTimeout)
	ctx := context.Background()
	l := limit(t, 2, time.Hour, 0)
	exp := time.Now().Add(time.Hour).UnixMilli()
	keys := make([]algorithms.Key, 6)
	for i := range keys {
		keys[i] = freshKey(t)
		if err := setOv(t, s, "ovc", keys[i], algorithms.Override{Events: 3 + int64(i), Window: l.Window, Expires: exp}, 10); err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range keys {
		d := take(t, s, algorithms.Request{Zone: "ovc", Key: k, Limit: l, Cost: 1}, algorithms.Request{Zone: "plain", Key: k, Limit: l, Cost: 1})
		if !d[0].Allowed || !d[0].Overridden || d[0].Limit != 3+int64(i) || d[1].Overridden || d[1].Limit != 2 {
			t.Fatalf("key %d: %+v", i, d)
		}
	}
	live, _, err := s.Overrides(ctx, "ovc")
	if err != nil || len(live) != len(keys) {
		t.Fatalf("listing: %d, %v", len(live), err)
	}
	for _, k := range keys {
		if _, ok, err := s.DeleteOverride(ctx, "ovc", k); !ok || err != nil {
			t.Fatalf("delete: %v %v", ok, err)
		}
		if d := take(t, s, algorithms.Request{Zone: "ovc", Key: k, Limit: l, Cost: 1})[0]; d.Overridden || d.Limit != 2 {
			t.Fatalf("after the delete: %+v", d)
		}
	}
}
