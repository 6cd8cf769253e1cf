package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestSentinelFailover: decisions through a redis+sentinel URL, across a
// SENTINEL FAILOVER, with the debt carried over by replication.
func TestSentinelFailover(t *testing.T) {
	ss := redistest.StartSentinel(t)
	m := &Redis{URL: "redis+sentinel://" + ss.SentinelAddr + "?master_name=" + ss.MasterName, Timeout: caddy.Duration(500 * time.Millisecond)}
	if err := m.Provision(caddyContext(t)); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	t.Cleanup(func() { _ = m.Cleanup() })

	l := limit(t, 5, time.Hour, 0)
	req := algorithms.Request{Zone: "sentinel", Key: freshKey(t), Limit: l, Cost: 1}
	key := m.Store.Key(req.Zone, req.Key)
	oldMaster := ss.Master
	calls := scriptCalls(t, oldMaster)
	for i := int64(1); i <= 3; i++ {
		out := make([]algorithms.Decision, 1)
		if err := m.Take(context.Background(), []algorithms.Request{req}, out); err != nil {
			t.Fatalf("take %d before the failover: %v", i, err)
		}
		if !out[0].Allowed || out[0].Remaining != 5-i {
			t.Fatalf("take %d before the failover: %+v", i, out[0])
		}
	}
	if n := scriptCalls(t, oldMaster) - calls; n < 3 {
		t.Fatalf("the master ran %d scripts for 3 Takes: the Takes went elsewhere", n)
	}
	before := oldMaster.Do(t, "GET", key)
	if before == nil {
		t.Fatal("no state on the master")
	}

	start := time.Now()
	ss.Failover(t) // waits until the replica acknowledged every write
	failoverTook := time.Since(start)
	newMaster := ss.Master
	if newMaster == oldMaster {
		t.Fatal("Failover did not swap the master")
	}
	if got := newMaster.Do(t, "GET", key); got != before {
		t.Fatalf("the new master holds %v, the old one held %v", got, before)
	}

	// Decisions resume against the new master within a bounded time (a
	// probe on another key, so that failed attempts cannot blur the count).
	probe := algorithms.Request{Zone: "probe", Key: freshKey(t), Limit: limit(t, 1000, time.Hour, 0), Cost: 1}
	resumeStart := time.Now()
	var errs []string
	for {
		out := make([]algorithms.Decision, 1)
		el, err := timedTake(t, context.Background(), m.Store, []algorithms.Request{probe}, out)
		if el > time.Duration(m.Timeout)+failMargin {
			t.Fatalf("a Take took %v during the failover (timeout %v)", el, time.Duration(m.Timeout))
		}
		if err == nil {
			break
		}
		errs = append(errs, err.Error())
		if time.Since(resumeStart) > 15*time.Second {
			t.Fatalf("no decision within 15s of the failover; errors: %q", errs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("failover took %v; decisions resumed %v later after %d failed attempts %q", failoverTook, time.Since(resumeStart), len(errs), errs)

	// 3 of 5 were spent before: exactly 2 more pass.
	calls = scriptCalls(t, newMaster)
	var got []algorithms.Decision
	for attempt := 0; len(got) < 3 && attempt < 20; attempt++ {
		out := make([]algorithms.Decision, 1)
		if err := m.Take(context.Background(), []algorithms.Request{req}, out); err != nil {
			t.Logf("take after the failover: %v", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		got = append(got, out[0])
	}
	if len(got) != 3 || !got[0].Allowed || got[0].Remaining != 1 || !got[1].Allowed || got[1].Remaining != 0 || got[2].Allowed {
		t.Fatalf("after the failover: %+v; want allowed (1 left), allowed (0 left), refused", got)
	}
	if n := scriptCalls(t, newMaster) - calls; n < 3 {
		t.Fatalf("the new master ran %d scripts for 3 Takes", n)
	}
}
