package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// Concurrency zones (issue 16) beside count, penalty and delay zones
// (issues 18 and 17), in one script call: the modes and the argument
// layout of both kinds side by side (script.go, lua/take.lua).

// A refundable take (a count zone, mode 3) and a concurrency zone's take
// in one call: both allowed, the charge's instant in the reply, the lease
// added; the refund of the count zone and the release of the slot, each
// through its own path, leave the key as it was; the renewal (mode 5)
// keeps the lease of a running request and takes no charge.
func TestCountAndConcurrencyInRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	k := freshKey(t)
	rate := limit(t, 5, time.Hour, 0)
	conc := concLimit(t, 1, time.Minute)
	slots := s.SlotsKey("ix_conc", k)
	reqs := func() []algorithms.Request {
		return []algorithms.Request{{Zone: "ix_count", Key: k, Limit: rate, Cost: 1, Refundable: true}, concReq("ix_conc", k, conc)}
	}
	first := reqs()
	d := take(t, s, first...)
	if !d[0].Allowed || !d[1].Allowed || d[0].At == 0 || d[0].Remaining != 4 || d[1].Remaining != 0 {
		t.Fatalf("first: %+v; want both allowed, the charge's instant, 4 left and no slot", d)
	}
	if n := len(heldIn(t, s.Client(), slots)); n != 1 {
		t.Fatalf("%d leases after the first, want 1", n)
	}
	// A second request while the first runs: refused by the slots, the
	// count zone charged nothing.
	if d := take(t, s, reqs()...); d[1].Allowed || !d[0].Allowed || d[0].Remaining != 4 {
		t.Fatalf("second: %+v; want refused by the concurrency zone, the count zone showing 4 left uncharged", d)
	}
	// A renewal through the script: the lease is kept, nothing charged.
	c := getCall(context.Background(), time.Now().Add(s.timeout))
	c.setKeysBy(1, func(b []byte, _ int) []byte { return append(b, slots...) })
	c.addArgsBy(1, func(b []byte, _ int) []byte { return s.argc.appendRenewal(b, &first[1]) })
	if _, err := s.batch.do(c); err != nil || c.replyErr() != nil {
		t.Fatalf("renewal: %v %v", err, c.replyErr())
	}
	putCall(c)
	if n := len(heldIn(t, s.Client(), slots)); n != 1 {
		t.Fatalf("%d leases after a renewal, want 1", n)
	}
	// The response's status does not count: the charge goes back; the
	// request ends: the slot goes back.
	refundAndWait(t, s, []algorithms.Refund{{Zone: "ix_count", Key: k, Limit: rate, Cost: 1, At: d[0].At}})
	if err := s.Release(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitLeases(t, s.Client(), slots, 0, 5*time.Second)
	got := make([]algorithms.Decision, 1)
	found := make([]bool, 1)
	if err := s.PeekKeys(context.Background(), "ix_count", []algorithms.Key{k}, rate, got, found); err != nil {
		t.Fatal(err)
	}
	if got[0].Remaining != 5 {
		t.Fatalf("after the refund: %d left, want 5", got[0].Remaining)
	}
	// A refund that names a concurrency zone gives nothing back and
	// touches no key (its slot goes back by Release only).
	if err := s.Refund(context.Background(), []algorithms.Refund{{Zone: "ix_conc", Key: k, Limit: conc, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
}

// A rate zone with a penalty beside a concurrency zone: the penalty starts
// when the rate zone refuses (written in the same call), the refused
// requests take no slot, and the deny cache, though the penalty would let
// it answer, never answers a request with a concurrency zone: every
// request reaches Redis and is refused by the penalty there.
func TestPenaltyAndConcurrencyDenyCache(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 1000)
	k := freshKey(t)
	rate := limit(t, 1, time.Hour, 0)
	rate.Penalty = int64(time.Hour / time.Millisecond)
	conc := concLimit(t, 2, time.Minute)
	slots := s.SlotsKey("px_conc", k)
	both := func() []algorithms.Request {
		return []algorithms.Request{{Zone: "px_rate", Key: k, Limit: rate, Cost: 1}, concReq("px_conc", k, conc)}
	}
	first := both()
	if d := take(t, s, first...); !d[0].Allowed || !d[1].Allowed {
		t.Fatalf("first: %+v", d)
	}
	calls := scriptCalls(t, srv)
	for i := range 4 {
		d := take(t, s, both()...)
		if d[0].Allowed || d[0].RetryAfter < 59*time.Minute || !d[1].Allowed || d[1].Remaining != 1 {
			t.Fatalf("refusal %d: %+v; want refused by the penalty (an hour), the slots showing 1 free and untaken", i, d)
		}
	}
	if got := scriptCalls(t, srv) - calls; got != 4 {
		t.Fatalf("%d script calls for 4 refusals with a concurrency zone, want 4 (the deny cache stays out)", got)
	}
	if n := len(heldIn(t, s.Client(), slots)); n != 1 {
		t.Fatalf("%d leases, want 1 (the first request's; the refused took none)", n)
	}
	// The rate zone alone, in its penalty: answered by the deny cache.
	calls = scriptCalls(t, srv)
	for range 3 {
		if d := take(t, s, algorithms.Request{Zone: "px_rate", Key: k, Limit: rate, Cost: 1}); d[0].Allowed {
			t.Fatal("allowed in the penalty")
		}
	}
	if got := scriptCalls(t, srv) - calls; got > 1 {
		t.Fatalf("%d script calls for 3 refusals of the penalized zone alone, want at most 1", got)
	}
	if err := s.Release(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitLeases(t, s.Client(), slots, 0, 5*time.Second)
}

// A delay zone beside a concurrency zone in Redis: an admission that waits
// takes its slot at once; a request over the slots reserves nothing in the
// delay zone; a departed waiter's reservation and slot both go back.
func TestDelayAndConcurrencyInRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	k := freshKey(t)
	shaped := limitOf(t, algorithms.TokenBucket, 10, time.Hour, 1) // a token per 6 minutes
	shaped.Delay = int64(30 * time.Minute / time.Millisecond)
	conc := concLimit(t, 2, time.Minute)
	slots := s.SlotsKey("dx_conc", k)
	req := func() []algorithms.Request {
		return []algorithms.Request{{Zone: "dx_shaped", Key: k, Limit: shaped, Cost: 1, Refundable: true}, concReq("dx_conc", k, conc)}
	}
	first, second, third := req(), req(), req()
	if d := take(t, s, first...); !d[0].Allowed || d[0].Delay != 0 || !d[1].Allowed {
		t.Fatalf("first: %+v", d)
	}
	d2 := take(t, s, second...)
	if !d2[0].Allowed || d2[0].Delay < 6*time.Minute-time.Second || !d2[1].Allowed {
		t.Fatalf("second: %+v; want admitted to wait 6 minutes, with a slot", d2)
	}
	if n := len(heldIn(t, s.Client(), slots)); n != 2 {
		t.Fatalf("%d leases with one running and one waiting, want 2", n)
	}
	if d := take(t, s, third...); d[1].Allowed || !d[0].Allowed {
		t.Fatalf("third: %+v; want refused by the slots (the delay zone would let it wait)", d)
	}
	// The third reserved nothing: a request that may wait now gets 12
	// minutes; the second departs (its reservation and slot back), and the
	// wait falls back to 6.
	peek := func() time.Duration {
		got := make([]algorithms.Decision, 1)
		found := make([]bool, 1)
		if err := s.PeekKeys(context.Background(), "dx_shaped", []algorithms.Key{k}, shaped, got, found); err != nil {
			t.Fatal(err)
		}
		return got[0].ResetAfter
	}
	if r := peek(); r < 12*time.Minute-2*time.Second || r > 12*time.Minute {
		t.Fatalf("the shaped key is full again in %v, want 12 minutes (a charge and one reservation)", r)
	}
	refundAndWait(t, s, []algorithms.Refund{{Zone: "dx_shaped", Key: k, Limit: shaped, Cost: 1, At: d2[0].At}})
	if err := s.Release(context.Background(), second); err != nil {
		t.Fatal(err)
	}
	waitLeases(t, s.Client(), slots, 1, 5*time.Second)
	if r := peek(); r < 6*time.Minute-2*time.Second || r > 6*time.Minute {
		t.Fatalf("after the departure the shaped key is full again in %v, want 6 minutes", r)
	}
	if err := s.Release(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitLeases(t, s.Client(), slots, 0, 5*time.Second)
}
