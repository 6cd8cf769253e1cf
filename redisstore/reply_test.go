package redisstore

import (
	"strconv"
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
	var slack time.Duration
	for round := range 4 {
		start := time.Now()
		want := take(t, s, raw...)
		f0 := srv.CommandStats(t, "fcall")
		srv.Do(t, "FUNCTION", "FLUSH")
		got := take(t, s, typed...)
		// The keys' waits differ by the change in the time between their
		// decisions since round 0: at most the longest such time yet
		// (measured, so a loaded machine widens it), and a millisecond's
		// rounding each.
		slack = max(slack, time.Since(start)+2*time.Millisecond)
		if f1 := srv.CommandStats(t, "fcall"); round < 3 && f1.Failed-f0.Failed != 1 {
			t.Fatalf("round %d: %d failed FCALLs, want 1 (the typed path not taken)", round, f1.Failed-f0.Failed)
		}
		for i := range want {
			w, g := want[i], got[i]
			if g.Allowed != w.Allowed || g.Remaining != w.Remaining || g.Limit != w.Limit || g.InFlight != w.InFlight ||
				(g.At == 0) != (w.At == 0) || (g.RetryAfter-w.RetryAfter).Abs() > slack || (g.ResetAfter-w.ResetAfter).Abs() > slack {
				t.Errorf("round %d, zone %d: typed path %+v, raw path %+v (slack %v)", round, i, g, w, slack)
			}
		}
		if round >= 2 && (want[1].Allowed || got[1].Allowed) {
			t.Fatalf("round %d: not refused: raw %+v, typed %+v", round, want[1], got[1])
		}
	}
}

// TestAdmissionReplyOfMixedZones: an admission's array of several zones
// (lua/take.lua) mixing a zone allowing at once, refundable, so the reply
// ends with Redis's time, a report-only zone refusing and a delayed zone
// admitted after a wait is read zone by zone, twice.
func TestAdmissionReplyOfMixedZones(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", time.Second, 0)
	k := freshKey(t)
	delayed := limit(t, 1, time.Second, 0)
	delayed.Delay = 5000
	quick := algorithms.Request{Zone: "mixed_quick", Key: k, Limit: limit(t, 10, time.Hour, 0), Cost: 1, Refundable: true}
	report := algorithms.Request{Zone: "mixed_report", Key: k, Limit: limit(t, 1, time.Hour, 0), Cost: 1, ReportOnly: true}
	wait := algorithms.Request{Zone: "mixed_wait", Key: k, Limit: delayed, Cost: 1}
	take(t, s, report)
	take(t, s, wait)
	for round := range 2 {
		d := take(t, s, quick, report, wait)
		if !d[0].Allowed || d[0].Remaining != int64(9-round) || d[0].RetryAfter != 0 || d[0].At == 0 ||
			d[0].ResetAfter <= 0 || d[0].ResetAfter > time.Duration(round+1)*6*time.Minute {
			t.Errorf("round %d: the zone allowing at once: %+v", round, d[0])
		}
		if d[1].Allowed || d[1].Remaining != 0 || d[1].RetryAfter < 59*time.Minute || d[1].RetryAfter > time.Hour {
			t.Errorf("round %d: the report-only zone refusing: %+v", round, d[1])
		}
		if wantWait := time.Duration(round+1) * time.Second; !d[2].Allowed ||
			d[2].Delay <= wantWait-time.Second/2 || d[2].Delay > wantWait {
			t.Errorf("round %d: the delayed zone: %+v, want admitted after a wait of about %v", round, d[2], wantWait)
		}
	}
}

// TestPackedAdmissionReply: a one-zone admission with no wait comes as one
// integer when its remaining and reset-after fit one of the three packings
// (lua/take.lua), as an array otherwise; both read back as the same
// numbers. Each case is a fresh key charged once at a fixed time.
func TestPackedAdmissionReply(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	const day = 24 * time.Hour
	for i, tc := range []struct {
		events, cost int64
		window       time.Duration
		packed       bool
		rem          int64
		reset        time.Duration
	}{
		{10, 1, 10 * time.Second, true, 9, time.Second},                           // reset below 2^16 ms
		{10, 1, time.Hour, true, 9, 6 * time.Minute},                              // below 2^24
		{10, 1, 30 * day, true, 9, 3 * day},                                       // below 2^32
		{10, 1, 1000 * day, false, 9, 100 * day},                                  // 2^32 or more
		{200_000_000, 20_000_000, time.Hour, false, 180_000_000, 6 * time.Minute}, // remaining too large for its reset
		{200_000_000, 1, time.Hour, true, 199_999_999, time.Millisecond},
	} {
		l := limit(t, tc.events, tc.window, 0)
		r := algorithms.Request{Limit: l, Cost: tc.cost}
		cmd := twinScript.Run(ctx, c, []string{"packed:" + strconv.Itoa(i)}, luaArgs([]any{int64(1_800_000_000_000)}, false, r)...)
		v, err := cmd.Result()
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if _, isInt := v.(int64); isInt != tc.packed {
			t.Errorf("case %d: reply %T %v, want packed %v", i, v, v, tc.packed)
		}
		got := make([]algorithms.Decision, 1)
		if err := decodeRaw(appendRESP(nil, v), []algorithms.Request{r}, got, false, nil); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if d := got[0]; !d.Allowed || d.Delay != 0 || d.Remaining != tc.rem || d.ResetAfter != tc.reset {
			t.Errorf("case %d: %+v, want allowed, remaining %d, reset-after %v", i, d, tc.rem, tc.reset)
		}
	}
	for _, bad := range []string{":-4\r\n", ":3\r\n", ":x\r\n"} {
		if err := decodeRaw([]byte(bad), make([]algorithms.Request, 1), make([]algorithms.Decision, 1), false, nil); err == nil {
			t.Errorf("%q: read without an error", bad)
		}
	}
	if err := decodeRaw([]byte(":4\r\n"), make([]algorithms.Request, 2), make([]algorithms.Decision, 2), false, nil); err == nil {
		t.Error("a packed admission read for two zones")
	}
}

// TestKeyTTL: a write's TTL is never shorter than the time to full plus a
// second, and less than 17/16 of it; the TTLs of nearby resets are one.
func TestKeyTTL(t *testing.T) {
	for _, ms := range []int64{-5, 0, 1, 3095, 3096, 64535, 64536, 719_000, 720_000, 86_400_000, 1 << 40} {
		reset := time.Duration(ms) * time.Millisecond
		base := time.Duration(max(ms, 0)+1000) * time.Millisecond
		if got := KeyTTL(reset); got < base || got*16 >= base*17 {
			t.Errorf("KeyTTL(%v) = %v, want in [%v, 17/16 of it)", reset, got, base)
		}
	}
	if a, b := KeyTTL(720_000*time.Millisecond), KeyTTL(723_000*time.Millisecond); a != b {
		t.Errorf("KeyTTL of 720s and 723s: %v and %v, want one TTL", a, b)
	}
}
