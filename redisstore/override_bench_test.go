package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/stores"
)

// BenchmarkTakeOverrides compares, side by side in one run, a decision in
// a zone with no override against one in a zone holding 10,000 (set
// through SetOverride, as the admin API does): for a key without one
// (the script's GET of its override finds nothing) and for a key with one
// (the script reads and applies it). Sequential Takes of one zone over
// 10,000 keys; besides ns/op (the round trip, noisy on a shared machine),
// redis-µs/call is Redis's own CPU per script call (INFO commandstats),
// which is where an override costs.
//
//	go test -run XXX -bench TakeOverrides -benchtime 20000x ./redisstore/
func BenchmarkTakeOverrides(b *testing.B) {
	url := benchRedisURL(b)
	s := newTestStore(b, url, "", testTimeout, 0)
	ctx := context.Background()
	l := limit(b, 1_000_000_000, time.Hour, 0)
	const n = 10_000
	keys := make([]algorithms.Key, n)
	ovKeys := make([]algorithms.Key, n)
	for i := range keys {
		keys[i] = keyOf(b, "plain-"+strconv.Itoa(i))
		ovKeys[i] = keyOf(b, "overridden-"+strconv.Itoa(i))
	}
	now := time.Now().UnixMilli()
	for i, k := range ovKeys {
		e := stores.OverrideEntry{Key: k, Override: algorithms.Override{Events: 2_000_000_000, Window: l.Window, Expires: now + time.Hour.Milliseconds() + int64(i)},
			Reason: "bench", By: "bench", At: now}
		if err := s.SetOverride(ctx, "ovr", e, n); err != nil {
			b.Fatal(err)
		}
	}
	rc := s.client.(*redis.Client)
	for _, tc := range []struct {
		name string
		zone string
		keys []algorithms.Key
		ov   bool
	}{
		{"none", "plain", keys, false},
		{"10000/key-without", "ovr", keys, false},
		{"10000/key-with", "ovr", ovKeys, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			out := make([]algorithms.Decision, 1)
			reqs := []algorithms.Request{{Zone: tc.zone, Limit: l, Cost: 1}}
			for _, k := range tc.keys[:100] { // warm
				reqs[0].Key = k
				_ = s.Take(ctx, reqs, out)
			}
			rc.ConfigResetStat(ctx)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				reqs[0].Key = tc.keys[i%n]
				if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed || out[0].Overridden != tc.ov {
					b.Fatalf("take: %v %+v", err, out[0])
				}
			}
			b.StopTimer()
			calls, usec := scriptStats(b, rc)
			if calls > 0 {
				b.ReportMetric(usec/calls, "redis-µs/call")
			}
		})
	}
}

// scriptStats reads the calls and CPU time (µs) of the decision script
// (FCALL or EVALSHA) from INFO commandstats.
func scriptStats(b *testing.B, c *redis.Client) (calls, usec float64) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_fcall" && name != "cmdstat_evalsha") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls += x
			case "usec":
				usec += x
			}
		}
	}
	return calls, usec
}
