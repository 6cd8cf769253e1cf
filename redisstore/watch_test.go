package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// withoutCtl drops the store's control keys (watch.go) from a key list.
func withoutCtl(keys []string) []string {
	var out []string
	for _, k := range keys {
		if !strings.Contains(k, "ctl:{sluice") {
			out = append(out, k)
		}
	}
	return out
}

// viewNow is one poll's view, retried (a restarted server's first
// answers may be errors of the broken connections) for up to 5 s.
func viewNow(t *testing.T, w *watcher) string {
	t.Helper()
	var err error
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(50 * time.Millisecond) {
		w.mu.Lock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var v string
		v, err = w.view(ctx)
		cancel()
		w.mu.Unlock()
		if err == nil {
			return v
		}
	}
	t.Fatalf("no view of Redis in 5 s: %v", err)
	return ""
}

// field returns the value after name in a view ("epoch", "run_id" …).
func field(view, name string) string {
	f := strings.Fields(view)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == name {
			return f[i+1]
		}
	}
	return ""
}

// TestWatchSeesRestarts: the canary and the master's run_id. A restart
// without persistence loses the canary; a restart that reloads a snapshot
// brings it back, with the same value, but not the writes made after the
// snapshot: only the run_id tells (item 4). Both change the view.
func TestWatchSeesRestarts(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 1000)
	v1 := viewNow(t, s.watch)
	if field(v1, "epoch") == "" || field(v1, "run_id") == "" || field(v1, "evicted_keys") != "0" {
		t.Fatalf("view %q: want the canary, a run_id and evicted_keys 0", v1)
	}
	if got := srv.Do(t, "GET", "sluice:v1:ctl:{sluice}:epoch"); got != field(v1, "epoch") {
		t.Fatalf("the canary holds %v, the view %q", got, v1)
	}
	srv.Do(t, "SAVE")
	srv.Restart(t) // reloads the snapshot: the canary is back
	v2 := viewNow(t, s.watch)
	if field(v2, "epoch") != field(v1, "epoch") || field(v2, "run_id") == field(v1, "run_id") {
		t.Fatalf("after a restart from a snapshot: view %q, before %q: want the same canary, another run_id", v2, v1)
	}
	srv.Do(t, "FLUSHALL")
	srv.Do(t, "SAVE") // an empty snapshot: the next restart comes back empty
	srv.Restart(t)
	v3 := viewNow(t, s.watch)
	if field(v3, "epoch") == field(v2, "epoch") || field(v3, "run_id") == field(v2, "run_id") {
		t.Fatalf("after a restart without data: view %q, before %q: want a new canary and run_id", v3, v2)
	}
	t.Logf("views:\n  %s\n  %s\n  %s", v1, v2, v3)
}

// TestWatchSeesEvictions: keys evicted under maxmemory change the view
// (the canary, which has no TTL, stays under volatile-lru: only the count
// tells).
func TestWatchSeesEvictions(t *testing.T) {
	srv := redistest.Start(t, "maxmemory-policy volatile-lru")
	s := denyStore(t, srv, 1000)
	v1 := viewNow(t, s.watch)
	used, err := strconv.Atoi(srv.Info(t, "memory")["used_memory"])
	if err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory", used+4<<20)
	big := strings.Repeat("x", 64<<10)
	for i := 0; srv.Info(t, "stats")["evicted_keys"] == "0"; i++ {
		if i == 1000 {
			t.Fatal("no eviction after 1000 writes of 64 KiB")
		}
		srv.Do(t, "SET", fmt.Sprintf("junk:%d", i), big, "EX", 3600)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	v2 := viewNow(t, s.watch)
	if field(v2, "epoch") != field(v1, "epoch") || field(v2, "evicted_keys") == "0" {
		t.Fatalf("after evictions: view %q, before %q: want the same canary, evicted_keys > 0", v2, v1)
	}
}

// TestWatchWithoutInfo: a user that may not run INFO (ACL) still gets a
// working deny cache (canary and resets only), and one warning.
func TestWatchWithoutInfo(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "noinfo", "on", ">pw-noinfo", "~*", "+@all", "-info")
	core, logs := observer.New(zap.DebugLevel)
	cfg := connConfig{URL: "redis://noinfo:pw-noinfo@" + srv.Addr, Timeout: testTimeout, Prefix: DefaultKeyPrefix}
	c, _, err := cfg.newClient()
	if err != nil {
		t.Fatal(err)
	}
	o := defaultOptions()
	o.Target, o.Logger = "test", zap.New(core)
	s := newStoreWith(c, false, DefaultKeyPrefix, testTimeout, o)
	t.Cleanup(func() { _ = s.Destruct() })
	waitArmed(t, s)
	r := algorithms.Request{Zone: "noinfo", Key: freshKey(t), Limit: limit(t, 1, time.Hour, 0), Cost: 1}
	refusedLocally(t, srv, s, r)
	time.Sleep(3 * watchInterval)
	if n := logs.FilterMessageSnippet("refuses INFO").Len(); n != 1 {
		t.Fatalf("%d warnings about INFO, want 1: %v", n, logs.All())
	}
	if s.deny.Len() == 0 {
		t.Fatal("the cached refusal was dropped: the polls without INFO fail or change")
	}
}

// TestDenyCacheSentinelFailover: a failover ends the cached refusals
// (the new master may have missed writes): right after it, a refused
// client's request reaches Redis again.
func TestDenyCacheSentinelFailover(t *testing.T) {
	ss := redistest.StartSentinel(t)
	m := &Redis{URL: "redis+sentinel://" + ss.SentinelAddr + "?master_name=" + ss.MasterName, Timeout: caddy.Duration(500 * time.Millisecond)}
	if err := m.Provision(caddyContext(t)); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	t.Cleanup(func() { _ = m.Cleanup() })
	s := m.Store
	waitArmed(t, s)
	r := algorithms.Request{Zone: "sfo", Key: freshKey(t), Limit: limit(t, 1, time.Hour, 0), Cost: 1}
	refusedLocally(t, ss.Master, s, r)
	ss.Failover(t)
	took, ok := waitFor(3*time.Second, func() bool {
		calls := scriptCalls(t, ss.Master)
		d := take(t, s, r)[0]
		return !d.Allowed && scriptCalls(t, ss.Master) > calls
	})
	if !ok {
		t.Fatalf("after the failover the refused client is still answered from the cache (%v)", took)
	}
	t.Logf("a request reached the new master %v after the failover ended", took.Round(time.Millisecond))
}

// waitFor polls cond every 20 ms until it returns true or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > timeout {
			return time.Since(start), false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClockStep: a server's clock that advanced, between two polls, more
// than the local time between them (plus 0.1% and 1ms) stepped forward.
func TestClockStep(t *testing.T) {
	const ms, us = int64(time.Millisecond), int64(1000)
	p := clockMark{us: 1_000_000_000 * us, sent: 10 * ms, recv: 11 * ms}
	for _, tc := range []struct {
		name    string
		m       clockMark
		stepped bool
	}{
		{"250ms on both", clockMark{us: p.us + 250*us, sent: 260 * ms, recv: 261 * ms}, false},
		{"as long as from sent to answered, 251ms", clockMark{us: p.us + 251*us, sent: 260 * ms, recv: 261 * ms}, false},
		{"that plus 0.1% and 1ms", clockMark{us: p.us + 252*us + 251, sent: 260 * ms, recv: 261 * ms}, false},
		{"a microsecond more", clockMark{us: p.us + 252*us + 252, sent: 260 * ms, recv: 261 * ms}, true},
		{"a second forward", clockMark{us: p.us + 1250*us, sent: 260 * ms, recv: 261 * ms}, true},
		{"a second back", clockMark{us: p.us - 750*us, sent: 260 * ms, recv: 261 * ms}, false},
		{"an hour, 0.05% fast", clockMark{us: p.us + 3_601_800*us, sent: 3_600_010 * ms, recv: 3_600_011 * ms}, false},
	} {
		if got := stepped(p, tc.m); got != tc.stepped {
			t.Errorf("%s: stepped %v, want %v", tc.name, got, tc.stepped)
		}
	}
}

// TestWatchQuiet: with nothing changing in Redis (but traffic), polls
// never clear the cache: a refusal stays cached over 8 polls.
func TestWatchQuiet(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 1000)
	r := algorithms.Request{Zone: "quiet", Key: freshKey(t), Limit: limit(t, 1, time.Hour, 0), Cost: 1}
	refusedLocally(t, srv, s, r)
	other := algorithms.Request{Zone: "quiet", Key: freshKey(t), Limit: limit(t, 1_000_000, time.Hour, 0), Cost: 1}
	for start := time.Now(); time.Since(start) < 8*watchInterval; {
		take(t, s, other)
	}
	calls := scriptCalls(t, srv)
	if d := take(t, s, r)[0]; d.Allowed || scriptCalls(t, srv) != calls {
		t.Fatalf("after 8 polls of a quiet Redis the refusal is no longer cached: %+v", d)
	}
}
