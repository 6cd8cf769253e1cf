package sluice

import (
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/memstore"
)

// TestReservationGivesBackOnce drives one reservation over a real memory
// store: the status settles a count zone's charge (given back when it does
// not count), a cancel gives every rate charge back, a release frees the
// slots, and no charge is ever given back twice.
func TestReservationGivesBackOnce(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone rs_count {
			key {http.request.header.X-User}
			events 10
			window 1h
			count 5xx
		}
		zone rs_conc {
			key {http.request.header.X-User}
			concurrent 2
		}
	}`, clock)
	admitted := func() *admission {
		t.Helper()
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", "rs")
		caddyhttp.NewTestReplacer(r)
		a := h.admit(r)
		if err := a.plan(); err != nil {
			t.Fatal(err)
		}
		if err := a.decide(); err != nil {
			t.Fatal(err)
		}
		a.verdict()
		if a.out != allow || !a.reserved || !a.wantsStatus || len(a.res.charges) != 2 {
			t.Fatalf("outcome %d, reserved %v, wants the status %v, %d charges; want an allowed request with 2 charges", a.out, a.reserved, a.wantsStatus, len(a.res.charges))
		}
		return a
	}
	st := h.store.(*memstore.Store)
	count, conc := h.zones[1], h.zones[0] // in name order: rs_conc, rs_count
	a := admitted()
	key := a.reqs[0].Key // one user's: the same token in both zones
	left := func(*admission) int64 {
		d, _ := st.Peek(count.name, key, count.limit)
		return d.Remaining
	}
	inUse := func(*admission) int { return st.InUse(conc.name, key) }
	if left(a) != 9 || inUse(a) != 1 {
		t.Fatalf("admitted: %d left, %d slots in use; want 9, 1", left(a), inUse(a))
	}
	// A 200 is not counted: the charge comes back, once.
	_ = a.res.give(giveStatus, 200)
	_ = a.res.give(giveStatus|giveCancel, 200)
	if left(a) != 10 || inUse(a) != 1 {
		t.Errorf("settled with a 200, twice: %d left, %d slots in use; want 10, 1", left(a), inUse(a))
	}
	b := admitted()
	if err := a.res.give(giveRelease, 0); err != nil {
		t.Fatal(err)
	}
	_ = a.res.give(giveRelease|giveCancel, 0)
	if inUse(b) != 1 || left(b) != 9 {
		t.Errorf("the first released twice beside a second: %d slots in use, %d left; want 1 (the second's), 9", inUse(b), left(b))
	}
	a.exit()

	// A cancel (a waiter's client gone) gives every rate charge back; the
	// status then settles nothing more, and the exit releases the slot.
	_ = b.res.give(giveCancel, 0)
	_ = b.res.give(giveStatus, 503)
	if left(b) != 10 || inUse(b) != 1 {
		t.Errorf("cancelled, then a 503: %d left, %d slots in use; want 10, 1", left(b), inUse(b))
	}
	b.exit()
	c := admitted()
	_ = c.res.give(giveStatus, 503) // counted: kept
	if left(c) != 9 {
		t.Errorf("a 503 counted: %d left, want 9", left(c))
	}
	c.exit()
	if inUse(c) != 0 {
		t.Errorf("after every exit: %d slots in use, want 0", inUse(c))
	}
}
