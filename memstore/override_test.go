package memstore

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/stores"
)

func setOverride(t *testing.T, s *Store, zone string, key algorithms.Key, o algorithms.Override, maxN int) error {
	t.Helper()
	return s.SetOverride(context.Background(), zone, stores.OverrideEntry{Key: key, Override: o, Reason: "test", By: "127.0.0.1:1", At: s.now()}, maxN)
}

// An override decides the key's requests in this store: a raised limit
// admits beyond the zone's without refunding what was spent, a lowered one
// refuses at once, block refuses and unlimited admits charging nothing;
// its expiry, or its deletion, restores the zone's limit; other keys keep
// the zone's.
func TestOverrideDecides(t *testing.T) {
	s, clock := newTestStore(t, 0)
	ctx := context.Background()
	zone, k, other := "ov", keyOf(1), keyOf(2)
	l := perHour20
	for range 15 {
		if d := take1(t, s, req(zone, k, l, 1)); !d.Allowed || d.Overridden {
			t.Fatalf("before any override: %+v", d)
		}
	}
	// lowered to 10: 15 spent, refused at once
	if err := setOverride(t, s, zone, k, algorithms.Override{Events: 10, Window: hour, Expires: t0 + 1000}, 10); err != nil {
		t.Fatal(err)
	}
	if d := take1(t, s, req(zone, k, l, 1)); d.Allowed || !d.Overridden || d.Limit != 10 {
		t.Fatalf("lowered to 10 after 15 spent: %+v, want refused, limit 10", d)
	}
	if d := take1(t, s, req(zone, other, l, 1)); !d.Allowed || d.Overridden || d.Limit != 20 {
		t.Fatalf("another key: %+v", d)
	}
	// raised to 100: the 15 spent stay spent
	if err := setOverride(t, s, zone, k, algorithms.Override{Events: 100, Window: hour, Expires: t0 + 1000}, 10); err != nil {
		t.Fatal(err)
	}
	if d := take1(t, s, req(zone, k, l, 1)); !d.Allowed || d.Limit != 100 || d.Remaining != 100-16 {
		t.Fatalf("raised to 100 after 15 spent: %+v, want remaining 84", d)
	}
	// block, then unlimited: nothing charged
	_ = setOverride(t, s, zone, k, algorithms.Override{Block: true, Expires: t0 + 1000}, 10)
	if d := take1(t, s, req(zone, k, l, 1)); d.Allowed || d.Limit != 0 || d.RetryAfter != msDur(1000) {
		t.Fatalf("blocked: %+v", d)
	}
	_ = setOverride(t, s, zone, k, algorithms.Override{Unlimited: true, Expires: t0 + 1000}, 10)
	for range 50 {
		if d := take1(t, s, req(zone, k, l, 1)); !d.Allowed {
			t.Fatalf("unlimited: %+v", d)
		}
	}
	// expiry: the zone's limit again, 16 spent
	clock.Advance(1000)
	if d := take1(t, s, req(zone, k, l, 1)); !d.Allowed || d.Overridden || d.Remaining != 20-17 {
		t.Fatalf("after the expiry: %+v, want remaining 3 (nothing charged while unlimited)", d)
	}
	live, expired, _ := s.Overrides(ctx, zone)
	if len(live) != 0 || len(expired) != 1 || !expired[0].Unlimited || expired[0].Reason != "test" {
		t.Fatalf("after the expiry: live %v, expired %v", live, expired)
	}
	// delete
	_ = setOverride(t, s, zone, k, algorithms.Override{Block: true, Expires: t0 + 5000}, 10)
	if e, ok, _ := s.DeleteOverride(ctx, zone, k); !ok || !e.Block {
		t.Fatalf("delete: %+v %v", e, ok)
	}
	if d := take1(t, s, req(zone, k, l, 1)); !d.Allowed || d.Overridden {
		t.Fatalf("after the delete: %+v", d)
	}
}

// A zone holds at most its bound of overrides; replacing one is not
// another; an expired one makes room.
func TestOverrideBound(t *testing.T) {
	s, clock := newTestStore(t, 0)
	for i := range 3 {
		if err := setOverride(t, s, "b", keyOf(i), algorithms.Override{Block: true, Expires: t0 + int64(10*(i+1))}, 3); err != nil {
			t.Fatal(err)
		}
	}
	if err := setOverride(t, s, "b", keyOf(9), algorithms.Override{Block: true, Expires: t0 + 100}, 3); !errors.Is(err, stores.ErrTooManyOverrides) {
		t.Fatalf("a fourth of 3: %v", err)
	}
	if err := setOverride(t, s, "b", keyOf(1), algorithms.Override{Unlimited: true, Expires: t0 + 100}, 3); err != nil {
		t.Fatalf("replacing one: %v", err)
	}
	if err := setOverride(t, s, "other", keyOf(9), algorithms.Override{Block: true, Expires: t0 + 100}, 3); err != nil {
		t.Fatalf("another zone: %v", err)
	}
	clock.Advance(10)
	if err := setOverride(t, s, "b", keyOf(9), algorithms.Override{Block: true, Expires: t0 + 100}, 3); err != nil {
		t.Fatalf("after one expired: %v", err)
	}
}
