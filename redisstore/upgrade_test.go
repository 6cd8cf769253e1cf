package redisstore

import (
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestReadsTheValuesOfTheVersionBefore: values stored by the script of the
// version before the spec argument and the status reply (main at 1f3ed00:
// three takes of cost 1 from 1700000000000, 7 ms apart; the penalized one
// refused its third) are read by this script as the Go codec reads them,
// and decided as algorithms.Step decides them: the stored form did not
// change, so keys written before an upgrade keep their state.
func TestReadsTheValuesOfTheVersionBefore(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	pen := limitOf(t, algorithms.TokenBucket, 2, time.Minute, 0)
	pen.Penalty = 60000
	for _, v := range []struct {
		l   algorithms.Limit
		raw string
	}{
		{limitOf(t, algorithms.TokenBucket, 10, time.Minute, 0), "\x8e\x17Hv\xe8\x0e\x02\xbe\x94\x01"},
		{limitOf(t, algorithms.GCRA, 10, time.Minute, 5), "\xa0\x17Hw.P\x01"},
		{limitOf(t, algorithms.SlidingWindow, 10, time.Minute, 0), "\xc2\x01\x17Hv\x99\xe0\x03\x01"},
		{limitOf(t, algorithms.FixedWindow, 10, time.Minute, 0), "\xe6\x17Hv\x99\xe0\x03\x01"},
		{limitOf(t, algorithms.SlidingLog, 10, time.Minute, 0), "l1700000000000,0,7,14"},
		{pen, "p\x01\x8b\xcf\xe5h\x0e\x8e\x17Hv\xe8\x0e\x01Ԥ\x01"},
	} {
		st, ok := DecodeState(v.raw)
		if !ok {
			t.Fatalf("%s: the Go codec does not read %q", v.l.Algorithm, v.raw)
		}
		for _, now := range []int64{1_700_000_000_020, 1_700_000_005_000} {
			key := "upgrade:" + v.l.Algorithm.String()
			srv.Do(t, "SET", key, v.raw)
			want, _, _ := algorithms.Step(st, false, v.l, now, 1)
			fresh, _, _ := algorithms.Step(algorithms.State{}, true, v.l, now, 1)
			if want.Remaining == fresh.Remaining && want.Allowed == fresh.Allowed {
				t.Fatalf("%s at %d: the stored state decides as no state would: the test proves nothing", v.l.Algorithm, now)
			}
			got, err := runTwin(ctx, c, []string{key}, luaArgs([]any{now}, false, algorithms.Request{Limit: v.l, Cost: 1})...)
			if err != nil {
				t.Fatal(err)
			}
			d := zoneDecision(&algorithms.Request{Limit: v.l}, [replyPerZone]int64(got))
			if d.Allowed != want.Allowed || d.Remaining != want.Remaining || d.RetryAfter != want.RetryAfter || d.ResetAfter != want.ResetAfter {
				t.Errorf("%s at %d, %q: the script decides %+v, Go %+v", v.l.Algorithm, now, v.raw, d, want)
			}
		}
	}
}
