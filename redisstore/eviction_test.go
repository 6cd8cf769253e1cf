package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// observedStore is a store on url with the default options (deny cache on,
// so the watch runs), logging to the returned observer; its metrics'
// target label is the test's name.
func observedStore(t *testing.T, url string) (*Store, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	cfg := connConfig{URL: url, Timeout: testTimeout, Prefix: DefaultKeyPrefix}
	c, _, err := cfg.newClient()
	if err != nil {
		t.Fatal(err)
	}
	o := defaultOptions()
	o.Target, o.Logger = t.Name(), zap.New(core)
	s := newStoreWith(c, false, DefaultKeyPrefix, testTimeout, o)
	t.Cleanup(func() { _ = s.Destruct() })
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := s.warm(ctx); err != nil {
		t.Fatalf("warm: %v", err)
	}
	return s, logs
}

// waitFor waits up to 10 s for cond (the watch polls every 250 ms).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("10 s and still not: %s", what)
		}
	}
}

func logged(logs *observer.ObservedLogs, part string) int {
	return logs.FilterMessageSnippet(part).Len()
}

// TestEvictionPolicyAtLoad: a policy that can evict Sluice's keys
// (allkeys-*, volatile-*: every Sluice key has a TTL) is a warning at load
// naming noeviction; noeviction is not; a policy CONFIG GET cannot read
// (ACL) is said, and the load goes on.
func TestEvictionPolicyAtLoad(t *testing.T) {
	for _, tc := range []struct {
		policy string
		warn   bool
	}{{"allkeys-lru", true}, {"volatile-ttl", true}, {"volatile-lru", true}, {"allkeys-random", true}, {"noeviction", false}} {
		t.Run(tc.policy, func(t *testing.T) {
			srv := redistest.Start(t, "maxmemory 64mb", "maxmemory-policy "+tc.policy)
			s, logs := observedStore(t, srv.URL())
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			s.checkEviction(ctx)
			cancel()
			w := logs.FilterMessageSnippet("may evict Sluice's keys")
			if (w.Len() == 1) != tc.warn {
				t.Fatalf("policy %s: %d warnings (%v); want a warning: %v", tc.policy, w.Len(), w.All(), tc.warn)
			}
			if tc.warn && !strings.Contains(w.All()[0].ContextMap()["maxmemory_policy"].(string), tc.policy) {
				t.Fatalf("the warning does not name the policy: %v", w.All()[0].ContextMap())
			}
		})
	}
	t.Run("changed at run time", func(t *testing.T) {
		srv := redistest.Start(t, "maxmemory-policy noeviction")
		s, logs := observedStore(t, srv.URL())
		waitArmed(t, s)
		srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "volatile-lru")
		s.watch.mu.Lock()
		s.watch.evict.polls = 10 * policyEvery // the next poll rereads the policy
		s.watch.mu.Unlock()
		waitUntil(t, "a warning of the policy set at run time", func() bool { return logged(logs, "may evict Sluice's keys") == 1 })
	})
	t.Run("CONFIG renamed", func(t *testing.T) {
		srv := redistest.Start(t, "maxmemory-policy allkeys-lru", `rename-command CONFIG ""`)
		s, logs := observedStore(t, srv.URL())
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		s.checkEviction(ctx)
		cancel()
		if logged(logs, "could not be read") != 1 {
			t.Fatalf("no line saying the policy could not be read: %v", logs.All())
		}
	})
	t.Run("CONFIG denied", func(t *testing.T) {
		srv := redistest.Start(t, "maxmemory-policy allkeys-lru")
		s, logs := observedStore(t, srv.User(t, "noconfig", "~*", "+@all", "-config"))
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		s.checkEviction(ctx)
		cancel()
		if logged(logs, "could not be read") != 1 {
			t.Fatalf("no line saying the policy could not be read: %v", logs.All())
		}
	})
}

// TestEvictionsCountedAndLogged: keys Redis evicts are counted, exactly as
// its evicted_keys rose, and logged naming the bound they cost.
func TestEvictionsCountedAndLogged(t *testing.T) {
	srv := redistest.Start(t, "maxmemory-policy allkeys-random")
	s, logs := observedStore(t, srv.URL())
	waitArmed(t, s)
	srv.Do(t, "DEBUG", "POPULATE", 30000, "junk", 100)
	used, _ := strconv.ParseInt(srv.Info(t, "memory")["used_memory"], 10, 64)
	srv.Do(t, "CONFIG", "SET", "maxmemory", strconv.FormatInt(used*2/3, 10))
	srv.Do(t, "SET", "trigger", "x") // a write evicts down to maxmemory
	evicted, _ := strconv.ParseInt(srv.Info(t, "stats")["evicted_keys"], 10, 64)
	if evicted == 0 {
		t.Fatal("Redis evicted nothing")
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory", "0") // no more evictions
	metric := storeMetrics.evictedKeys.WithLabelValues("redis", t.Name())
	evicted, _ = strconv.ParseInt(srv.Info(t, "stats")["evicted_keys"], 10, 64)
	waitUntil(t, "the evictions counted", func() bool { return testutil.ToFloat64(metric) == float64(evicted) })
	waitUntil(t, "the evictions logged", func() bool { return logged(logs, "evicted keys for memory") == 1 })
	f := logs.FilterMessageSnippet("evicted keys for memory").All()[0]
	if !strings.Contains(f.Message, "one full limit") || f.ContextMap()["evicted_keys"] != evicted {
		t.Fatalf("the warning: %q %v; want the bound and %d evicted keys", f.Message, f.ContextMap(), evicted)
	}
}

// TestRestartLoggedAndCounted: a restart (the server's run_id changes) is
// counted and logged, saying whether the data was lost (every key's limit
// afresh) or kept (persistence).
func TestRestartLoggedAndCounted(t *testing.T) {
	for _, tc := range []struct {
		name, data, msg string
		conf            []string
	}{
		{"without persistence", "lost", "restarted empty", nil},
		{"with a snapshot", "kept", "with its data", []string{"save 3600 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, tc.conf...)
			s, logs := observedStore(t, srv.URL())
			waitArmed(t, s)
			take(t, s, algorithms.Request{Zone: "restart", Key: freshKey(t), Limit: limit(t, 5, time.Hour, 0), Cost: 1})
			srv.Restart(t)
			metric := storeMetrics.restarts.WithLabelValues("redis", t.Name(), tc.data)
			waitUntil(t, "the restart counted", func() bool { return testutil.ToFloat64(metric) == 1 })
			if n := logged(logs, tc.msg); n != 1 {
				t.Fatalf("%d lines %q; logs: %v", n, tc.msg, logs.All())
			}
		})
	}
}
