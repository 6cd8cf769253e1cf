package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// testTimeout is the decision timeout of tests that check decisions, not
// timeouts: generous, so that a loaded CI machine running -race cannot turn
// a correctness test into a flaky one. Tests of the timeout itself use
// DefaultTimeout.
const testTimeout = time.Second

// failMargin is what a failing Take may take beyond its timeout.
const failMargin = 100 * time.Millisecond

// testCtx is a context that ends with the test (bounded).
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var loadOnce sync.Once

// caddyContext returns the context of a running (empty) Caddy config, so
// modules provision exactly as they do in a server.
func caddyContext(t testing.TB) caddy.Context {
	t.Helper()
	loadOnce.Do(func() {
		if err := caddy.Load([]byte(`{"admin":{"disabled":true,"config":{"persist":false}}}`), false); err != nil {
			t.Fatalf("loading an empty Caddy config: %v", err)
		}
	})
	return caddy.ActiveContext()
}

// newTestStore builds a Store the way Provision does (same connConfig, same
// client bounds) for a standalone or Sentinel URL, closed at t's cleanup.
func newTestStore(t testing.TB, url, prefix string, timeout time.Duration, poolSize int) *Store {
	t.Helper()
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	o := redisPathOptions()
	cfg := connConfig{URL: url, Timeout: timeout, Prefix: prefix, PoolSize: poolSize, Grace: o.Grace}
	c, cluster, err := cfg.newClient()
	if err != nil {
		t.Fatalf("newClient(%q): %v", url, err)
	}
	o.Workers = cfg.workers()
	s := newStoreWith(c, cluster, prefix, timeout, o)
	t.Cleanup(func() { _ = s.Destruct() })
	// As Provision does: load the code (an unreachable server is fine).
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = s.warm(ctx)
	return s
}

// redisPathOptions are the store options of the tests of the Redis path
// itself: the default breaker, no deny cache (so that every Take runs the
// script; the deny cache has its own tests in denycache_test.go).
func redisPathOptions() storeOptions {
	o := defaultOptions()
	o.DenySize = 0
	return o
}

// newClusterStore builds a Store for a Redis Cluster the way Provision does.
func newClusterStore(t testing.TB, addrs []string, timeout time.Duration) *Store {
	t.Helper()
	cfg := connConfig{Cluster: addrs, Timeout: timeout, Prefix: DefaultKeyPrefix, Grace: DefaultLateReplyGrace}
	c, cluster, err := cfg.newClient()
	if err != nil {
		t.Fatalf("newClient(cluster %v): %v", addrs, err)
	}
	if !cluster {
		t.Fatalf("newClient(cluster %v) did not report a cluster client", addrs)
	}
	s := newStoreWith(c, cluster, DefaultKeyPrefix, timeout, redisPathOptions())
	t.Cleanup(func() { _ = s.Destruct() })
	return s
}

// mapResolver resolves placeholders from a map, for identity.Deriver.
type mapResolver map[string]any

func (m mapResolver) Get(k string) (any, bool) { v, ok := m[k]; return v, ok }

var (
	deriverOnce sync.Once
	deriver     *identity.Deriver
)

// keyOf derives the identity token of a raw client value exactly as the
// handler does for a zone keyed on one placeholder: an IP is masked (/32,
// /64), anything else is hashed.
func keyOf(t testing.TB, raw string) algorithms.Key {
	t.Helper()
	deriverOnce.Do(func() {
		c, err := identity.Compile("{test.key}")
		if err != nil {
			panic(err)
		}
		deriver, err = identity.NewDeriver([]identity.Candidate{c}, 32, 64)
		if err != nil {
			panic(err)
		}
	})
	tok, _ := deriver.Derive(mapResolver{"test.key": raw}, nil)
	return algorithms.Key(tok)
}

var keySeq atomic.Int64

// freshKey returns a key never used before in this test binary.
func freshKey(t testing.TB) algorithms.Key {
	t.Helper()
	return keyOf(t, fmt.Sprintf("%s/client-%d-%d", t.Name(), time.Now().UnixNano(), keySeq.Add(1)))
}

// limit builds a checked Limit.
func limit(t testing.TB, events int64, window time.Duration, burst int64) algorithms.Limit {
	t.Helper()
	l, err := algorithms.NewLimit(algorithms.TokenBucket, events, window, burst)
	if err != nil {
		t.Fatalf("NewLimit(%d, %v, %d): %v", events, window, burst, err)
	}
	return l
}

// take runs one Take of one zone and fails the test on an error.
func take(t testing.TB, s *Store, reqs ...algorithms.Request) []algorithms.Decision {
	t.Helper()
	out := make([]algorithms.Decision, len(reqs))
	if err := s.Take(context.Background(), reqs, out); err != nil {
		t.Fatalf("Take(%v): %v", zonesOf(reqs), err)
	}
	return out
}

func zonesOf(reqs []algorithms.Request) []string {
	z := make([]string, len(reqs))
	for i, r := range reqs {
		z[i] = r.Zone
	}
	return z
}

// scriptCalls is how many times the server ran the decision (FCALL, and
// EVALSHA and EVAL on a server without Functions; a failed call included).
func scriptCalls(t testing.TB, srv *redistest.Server) int64 {
	t.Helper()
	return srv.CommandStats(t, "fcall").Calls + srv.CommandStats(t, "evalsha").Calls + srv.CommandStats(t, "eval").Calls
}

// scanAll lists every key of a standalone server (SCAN, not KEYS).
func scanAll(t testing.TB, srv *redistest.Server) []string {
	t.Helper()
	var keys []string
	cursor := "0"
	for {
		v := srv.Do(t, "SCAN", cursor, "COUNT", 1000)
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			t.Fatalf("SCAN reply %#v", v)
		}
		cursor = fmt.Sprint(a[0])
		for _, k := range a[1].([]any) {
			keys = append(keys, fmt.Sprint(k))
		}
		if cursor == "0" {
			return keys
		}
	}
}

// state is a stored token bucket state (DecodeState).
type state struct{ debt, at, scale int64 }

func parseState(t testing.TB, raw string) state {
	t.Helper()
	st, ok := DecodeState(raw)
	if !ok || st.Alg != algorithms.TokenBucket {
		t.Fatalf("stored state %q is not a token bucket's", raw)
	}
	return state{debt: st.Debt, at: st.At, scale: st.Scale}
}

// getRaw returns a key's stored value through any client ("" when absent).
func getRaw(t testing.TB, c redis.Cmdable, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Get(ctx, key).Result()
	if err == redis.Nil {
		return ""
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v
}

// pttl returns a key's PTTL in milliseconds through any client.
func pttl(t testing.TB, c redis.Cmdable, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	if v < 0 {
		return int64(v) // -1: no TTL, -2: no key
	}
	return v.Milliseconds()
}

// timedTake runs one Take and returns its error and duration; a panic fails
// the test (it must never happen).
func timedTake(t testing.TB, ctx context.Context, s *Store, reqs []algorithms.Request, out []algorithms.Decision) (d time.Duration, err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Take panicked: %v", p)
		}
	}()
	start := time.Now()
	err = s.Take(ctx, reqs, out)
	return time.Since(start), err
}

// testArgs writes the tests' script arguments.
var testArgs argCache

// luaArgs appends the script arguments of reqs (production's writer) to
// args: takes, or (refund) the refunds of a cross-slot veto.
func luaArgs(args []any, refund bool, reqs ...algorithms.Request) []any {
	for i := range reqs {
		args = append(args, string(testArgs.appendTake(nil, &reqs[i], refund)))
	}
	return args
}

// refundArgs appends the script arguments of refunds (production's
// writer) to args.
func refundArgs(args []any, refunds ...algorithms.Refund) []any {
	for i := range refunds {
		args = append(args, string(testArgs.appendRefund(nil, &refunds[i])))
	}
	return args
}

// hashTag returns the hash tag of one of our keys: the text between its
// first '{' and the next '}', as Redis reads it.
func hashTag(k string) []byte {
	open := strings.IndexByte(k, '{')
	end := strings.IndexByte(k[open+1:], '}')
	return []byte(k[open+1 : open+1+end])
}

// storeAt is a store of url's standalone server with options o, closed by
// t's cleanup.
func storeAt(t testing.TB, url string, timeout time.Duration, o storeOptions) *Store {
	t.Helper()
	cfg := connConfig{URL: url, Timeout: timeout, Prefix: DefaultKeyPrefix}
	c, _, err := cfg.newClient()
	if err != nil {
		t.Fatal(err)
	}
	s := newStoreWith(c, false, DefaultKeyPrefix, timeout, o)
	t.Cleanup(func() { _ = s.Destruct() })
	return s
}
