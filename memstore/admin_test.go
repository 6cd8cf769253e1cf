package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Peek shows a key's state without changing it: peeking any number of
// times, the next request sees what it would have seen without the peeks.
// Reset forgets the key: the next request sees a full allowance.
func TestPeekAndReset(t *testing.T) {
	for _, alg := range []algorithms.Algorithm{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow,
		algorithms.FixedWindow, algorithms.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			s, clock := newTestStore(t, 0)
			l, err := algorithms.NewLimit(alg, 5, time.Hour, 0)
			if err != nil {
				t.Fatal(err)
			}
			k, other := keyOf(1), keyOf(2)

			d, found := s.Peek("z", k, l)
			if found || d.Remaining != 5 || d.Limit != 5 || !d.Allowed || d.RetryAfter != 0 || d.ResetAfter != 0 {
				t.Fatalf("fresh key: Peek = %+v found %v, want the full allowance, not found", d, found)
			}
			if s.Len() != 0 {
				t.Fatalf("Peek of a fresh key stored %d keys", s.Len())
			}

			for i := 0; i < 3; i++ {
				take1(t, s, req("z", k, l, 1))
			}
			take1(t, s, req("z", other, l, 2))
			clock.Advance(1000)
			for i := 0; i < 3; i++ {
				d, found = s.Peek("z", k, l)
				if !found || d.Remaining != 2 || !d.Allowed || d.ResetAfter <= 0 {
					t.Fatalf("peek %d after 3 of 5: %+v found %v, want 2 remaining", i, d, found)
				}
			}
			if got := take1(t, s, req("z", k, l, 1)); !got.Allowed || got.Remaining != 1 {
				t.Fatalf("the request after the peeks: %+v, want allowed with 1 remaining (the peeks charged nothing)", got)
			}
			take1(t, s, req("z", k, l, 1))
			refused := take1(t, s, req("z", k, l, 1))
			if refused.Allowed {
				t.Fatalf("the 6th request was allowed: %+v", refused)
			}
			d, found = s.Peek("z", k, l)
			if !found || d.Allowed || d.Remaining != 0 || d.RetryAfter != refused.RetryAfter || d.ResetAfter != refused.ResetAfter {
				t.Fatalf("exhausted key: Peek = %+v, want not allowed with the refusal's times (%+v)", d, refused)
			}

			if !s.Reset("z", k) {
				t.Fatal("Reset of a key with state reported none")
			}
			if s.Reset("z", k) {
				t.Fatal("a second Reset reported state")
			}
			if d, found = s.Peek("z", k, l); found || d.Remaining != 5 {
				t.Fatalf("after Reset: Peek = %+v found %v, want fresh", d, found)
			}
			if got := take1(t, s, req("z", k, l, 1)); !got.Allowed || got.Remaining != 4 {
				t.Fatalf("after Reset: %+v, want allowed with 4 remaining", got)
			}
			// Other keys and zones are untouched.
			if d, found = s.Peek("z", other, l); !found || d.Remaining != 3 {
				t.Fatalf("another key after Reset: %+v found %v, want 3 remaining", d, found)
			}
			if _, found = s.Peek("y", k, l); found {
				t.Fatal("the key shows state in another zone")
			}
		})
	}
}

// A key back to full, or written under another algorithm, holds no state
// to report; the module-level calls serve several keys at once.
func TestPeekKeys(t *testing.T) {
	s, clock := newTestStore(t, 0)
	l, _ := algorithms.NewLimit(algorithms.TokenBucket, 2, time.Second, 0)
	take1(t, s, req("z", keyOf(1), l, 1))
	out := make([]algorithms.Decision, 3)
	found := make([]bool, 3)
	keys := []algorithms.Key{keyOf(1), keyOf(2), keyOf(1)}
	if err := s.PeekKeys(context.Background(), "z", keys, l, out, found); err != nil {
		t.Fatal(err)
	}
	if !found[0] || found[1] || out[0].Remaining != 1 || out[1].Remaining != 2 {
		t.Fatalf("PeekKeys: %+v %v", out, found)
	}
	gcra := l
	gcra.Algorithm = algorithms.GCRA
	if d, found := s.Peek("z", keyOf(1), gcra); found || d.Remaining != 2 {
		t.Fatalf("state of another algorithm: %+v found %v, want none", d, found)
	}
	clock.Advance(500)
	if _, found := s.Peek("z", keyOf(1), l); found {
		t.Fatal("a key back to full shows state")
	}
	n, err := s.ResetKeys(context.Background(), "z", keys[:2])
	if err != nil || n != 1 {
		t.Fatalf("ResetKeys = %d %v, want 1", n, err)
	}
}
