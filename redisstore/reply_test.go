package redisstore

import (
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestTypedReplyReadAsRaw: a call sent again as a typed command (here after
// FUNCTION FLUSH: function.go) has its reply read by the same decoder as a
// raw one. One key's requests take the raw path, another's the typed path
// every time; their decisions (two zones, one refundable: the reply carries
// Redis's time; then refusals, whose stored values feed the deny cache)
// are the same.
func TestTypedReplyReadAsRaw(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", time.Second, 0)
	reqsOf := func(k algorithms.Key) []algorithms.Request {
		return []algorithms.Request{
			{Zone: "typed_a", Key: k, Limit: limit(t, 3, time.Hour, 0), Cost: 1, Refundable: true},
			{Zone: "typed_b", Key: k, Limit: limit(t, 2, time.Hour, 0), Cost: 1},
		}
	}
	raw, typed := reqsOf(freshKey(t)), reqsOf(freshKey(t))
	for round := range 4 {
		want := take(t, s, raw...)
		f0 := srv.CommandStats(t, "fcall")
		srv.Do(t, "FUNCTION", "FLUSH")
		got := take(t, s, typed...)
		if f1 := srv.CommandStats(t, "fcall"); round < 3 && f1.Failed-f0.Failed != 1 {
			t.Fatalf("round %d: %d failed FCALLs, want 1 (the typed path not taken)", round, f1.Failed-f0.Failed)
		}
		for i := range want {
			w, g := want[i], got[i]
			if g.Allowed != w.Allowed || g.Remaining != w.Remaining || g.Limit != w.Limit || g.InFlight != w.InFlight ||
				(g.At == 0) != (w.At == 0) || (g.RetryAfter-w.RetryAfter).Abs() > time.Second || (g.ResetAfter-w.ResetAfter).Abs() > time.Second {
				t.Errorf("round %d, zone %d: typed path %+v, raw path %+v", round, i, g, w)
			}
		}
		if round >= 2 && (want[1].Allowed || got[1].Allowed) {
			t.Fatalf("round %d: not refused: raw %+v, typed %+v", round, want[1], got[1])
		}
	}
}
