package redisstore

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestLuaRefusalStates: what the script adds to a refusal for the deny
// cache (lua/take.lua), through its test entry point: the decision's time,
// then each zone's stored value as read ("" for none, 0 for one over 1024
// bytes); nothing added to an allowed request.
func TestLuaRefusalStates(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	const now = int64(1_800_000_000_000)
	run := func(keys []string, reqs ...algorithms.Request) []any {
		t.Helper()
		args := []any{now}
		for i := range reqs {
			args = luaArgs(args, false, reqs[i])
		}
		v, err := scriptValues(twinScript.Run(ctx, c, keys, args...))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	sl := limitOf(t, algorithms.SlidingLog, 10_000, time.Hour, 0)
	tb := limitOf(t, algorithms.TokenBucket, 1, time.Hour, 0)
	keys := []string{"st:a", "st:b", "st:c"}
	reqs := []algorithms.Request{{Limit: tb, Cost: 1}, {Limit: sl, Cost: 1}, {Limit: tb, Cost: 1, ReportOnly: true}}
	if v := run(keys[:1], reqs[0]); len(v) != 4 || v[0] != int64(1) {
		t.Fatalf("an allowed request: %v", v)
	}
	for range 600 { // a long log: "l<base>" and 600 × ",0"
		run(keys[1:2], reqs[1])
	}
	raw := []string{getRaw(t, c, keys[0]), getRaw(t, c, keys[1])}
	if len(raw[1]) <= 1024 {
		t.Fatalf("the sliding log is only %d bytes", len(raw[1]))
	}
	v := run(keys, reqs...)
	want := []any{int64(0), int64(0), int64(3_600_000), int64(3_600_000), int64(1), int64(9400), int64(0), int64(3_600_000),
		int64(1), int64(1), int64(0), int64(0), now, raw[0], int64(0), ""}
	if fmt.Sprint(v) != fmt.Sprint(want) {
		t.Fatalf("a refusal:\n got %q\nwant %q", v, want)
	}
	// The production function adds them too (its now: Redis's TIME).
	var fargs []any
	for i := range reqs {
		fargs = luaArgs(fargs, false, reqs[i])
	}
	if err := c.FunctionLoad(ctx, LuaLibrary).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	f, err := scriptValues(c.FCall(ctx, LuaFunction, keys, fargs...))
	if err != nil || len(f) != 16 || f[13] != raw[0] || f[14] != int64(0) || f[15] != "" {
		t.Fatalf("FCALL of a refusal: %q %v", f, err)
	}
	if d := f[12].(int64) - time.Now().UnixMilli(); d < -5000 || d > 5000 {
		t.Fatalf("FCALL's time %d is %d ms from this clock's", f[12], d)
	}
}
