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
// through SetOverride, as the admin API does): for a key without one (the
// script's GET of its override finds nothing) and for a key with one (the
// script reads and applies it: 50,000 an hour, raised from the zone's).
// The three kinds run interleaved, in rounds of 1,000 sequential Takes of
// one zone each, so that a machine's drift touches them alike; each
// reports its round trip (µs/op) and Redis's own CPU per script call
// (redis-µs/call, INFO commandstats), and the ratios to the zone with
// none.
//
//	go test -run XXX -bench TakeOverrides -benchtime 60000x ./redisstore/
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
		e := stores.OverrideEntry{Key: k, Override: algorithms.Override{Events: 50_000, Window: l.Window, Expires: now + time.Hour.Milliseconds() + int64(i)},
			Reason: "bench", By: "bench", At: now}
		if err := s.SetOverride(ctx, "ovr", e, n); err != nil {
			b.Fatal(err)
		}
	}
	rc := s.client.(*redis.Client)
	kinds := []struct {
		name string
		zone string
		keys []algorithms.Key
		ov   bool
		dur  time.Duration
		ops  int
		usec float64
		cnt  float64
	}{
		{name: "none", zone: "plain", keys: keys},
		{name: "without", zone: "ovr", keys: keys},
		{name: "with", zone: "ovr", keys: ovKeys, ov: true},
	}
	out := make([]algorithms.Decision, 1)
	reqs := []algorithms.Request{{Limit: l, Cost: 1}}
	for k := range kinds { // warm
		reqs[0].Zone = kinds[k].zone
		for _, key := range kinds[k].keys[:100] {
			reqs[0].Key = key
			_ = s.Take(ctx, reqs, out)
		}
	}
	const round = 1000
	b.ReportAllocs()
	b.ResetTimer()
	done, i := 0, 0
	for done < b.N {
		for k := range kinds {
			kd := &kinds[k]
			reqs[0].Zone = kd.zone
			c0, u0 := scriptStats(b, rc)
			start := time.Now()
			for j := 0; j < round && done < b.N; j++ {
				reqs[0].Key = kd.keys[(i+j)%n]
				if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed || out[0].Overridden != kd.ov {
					b.Fatalf("take: %v %+v", err, out[0])
				}
				kd.ops++
				done++
			}
			kd.dur += time.Since(start)
			c1, u1 := scriptStats(b, rc)
			kd.cnt, kd.usec = kd.cnt+c1-c0, kd.usec+u1-u0
		}
		i += round
	}
	b.StopTimer()
	per := func(k int) (float64, float64) {
		kd := &kinds[k]
		return float64(kd.dur.Microseconds()) / float64(max(kd.ops, 1)), kd.usec / max(kd.cnt, 1)
	}
	rt0, cpu0 := per(0)
	for k := range kinds {
		rt, cpu := per(k)
		b.ReportMetric(rt, kinds[k].name+"-µs/op")
		b.ReportMetric(cpu, kinds[k].name+"-redis-µs/call")
		if k > 0 {
			b.ReportMetric(rt/rt0, kinds[k].name+"/none")
			b.ReportMetric(cpu/cpu0, kinds[k].name+"/none-redis")
		}
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
