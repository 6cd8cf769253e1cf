package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/faultproxy"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// lateStore is a store with the given timeout and late-reply grace (the
// default breaker, no deny cache, one pipeline worker) talking to a fresh
// Redis through a fault proxy, warmed while the proxy passes traffic.
func lateStore(t *testing.T, timeout, grace time.Duration) (*redistest.Server, *faultproxy.Proxy, *Store) {
	t.Helper()
	srv := redistest.Start(t)
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	cfg := connConfig{URL: "redis://" + p.Addr(), Timeout: timeout, Prefix: DefaultKeyPrefix, Grace: grace, Pipelines: 1}
	c, _, err := cfg.newClient()
	if err != nil {
		t.Fatal(err)
	}
	o := redisPathOptions()
	o.Grace, o.Workers, o.Target = grace, cfg.workers(), "test "+t.Name()
	s := newStoreWith(c, false, DefaultKeyPrefix, timeout, o)
	t.Cleanup(func() { _ = s.Destruct() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.warm(ctx); err != nil {
		t.Fatalf("warm: %v", err)
	}
	return srv, p, s
}

// TestLateReplyDecides: with every command delayed 90ms on its way to Redis
// (timeout 50ms, grace 500ms), each Take's reply comes late and decides:
// the first 3 of a limit of 3 are allowed and charged, the next 2 refused,
// none fails, the circuit breaker (threshold 5) stays closed, and nothing is
// counted unknown. Each wait ends by the timeout plus the grace.
func TestLateReplyDecides(t *testing.T) {
	const timeout, grace, latency = 50 * time.Millisecond, 500 * time.Millisecond, 90 * time.Millisecond
	_, p, s := lateStore(t, timeout, grace)
	unknown0, late0 := testutil.ToFloat64(s.unknown), testutil.ToFloat64(s.batch.late)
	req := algorithms.Request{Zone: "late", Key: freshKey(t), Limit: limit(t, 3, time.Hour, 0), Cost: 1}
	p.SetLatency(latency)
	if err := p.SetMode(faultproxy.Latency); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		out := make([]algorithms.Decision, 1)
		el, err := timedTake(t, context.Background(), s, []algorithms.Request{req}, out)
		if err != nil {
			t.Fatalf("Take %d: %v after %v; want the late reply's decision", i, err, el)
		}
		if el < timeout || el > timeout+grace+failMargin {
			t.Errorf("Take %d took %v; want past the timeout %v (the reply was late) and within it plus the grace %v", i, el, timeout, grace)
		}
		if want := i < 3; out[0].Allowed != want || out[0].Remaining != max(0, 2-int64(i)) {
			t.Errorf("Take %d: %+v; want allowed %v, remaining %d", i, out[0], want, max(0, 2-i))
		}
	}
	if st := s.CircuitState(); st != "closed" {
		t.Errorf("circuit %s after 5 late but answered calls; want closed", st)
	}
	if n := testutil.ToFloat64(s.unknown) - unknown0; n != 0 {
		t.Errorf("%v decisions counted unknown; want 0", n)
	}
	if n := testutil.ToFloat64(s.batch.late) - late0; n != 5 {
		t.Errorf("%v late replies counted; want 5", n)
	}
}

// TestSpareSendsCallsQueuedBehindAStall: one pipeline worker, every
// command delayed 150ms (timeout 100ms, grace 500ms). One Take occupies the
// worker for 150ms; 19 more, queued behind it, would reach their deadline
// unsent (and fail open) if they waited for it: a spare sends them halfway
// to their deadline, and their late replies decide. All 20 are decided, 10
// allowed and 10 refused on a limit of 10, none unsent, each within the
// timeout plus the grace.
func TestSpareSendsCallsQueuedBehindAStall(t *testing.T) {
	const timeout, grace, latency = 100 * time.Millisecond, 500 * time.Millisecond, 150 * time.Millisecond
	_, p, s := lateStore(t, timeout, grace)
	notSent0 := testutil.ToFloat64(s.notSent)
	req := algorithms.Request{Zone: "spare", Key: freshKey(t), Limit: limit(t, 10, time.Hour, 0), Cost: 1}
	p.SetLatency(latency)
	if err := p.SetMode(faultproxy.Latency); err != nil {
		t.Fatal(err)
	}
	type res struct {
		allowed bool
		el      time.Duration
		err     error
	}
	results := make(chan res, 20)
	take := func() {
		out := make([]algorithms.Decision, 1)
		el, err := timedTake(t, context.Background(), s, []algorithms.Request{req}, out)
		results <- res{out[0].Allowed, el, err}
	}
	go take()
	time.Sleep(10 * time.Millisecond) // the first is in the worker's round trip
	for range 19 {
		go take()
	}
	allowed := 0
	for range 20 {
		r := <-results
		switch {
		case r.err != nil:
			t.Errorf("Take: %v after %v; want a decision", r.err, r.el)
		case r.el > timeout+grace+failMargin:
			t.Errorf("Take decided after %v; want within the timeout %v plus the grace %v", r.el, timeout, grace)
		}
		if r.allowed {
			allowed++
		}
	}
	if allowed != 10 {
		t.Errorf("%d allowed; want exactly 10", allowed)
	}
	if n := testutil.ToFloat64(s.notSent) - notSent0; n != 0 {
		t.Errorf("%v counted unsent; want 0", n)
	}
}

// TestLateReplyPastTheGrace: with the replies later than the timeout plus
// the grace (or with the grace off), a Take fails as an unknown decision
// within the timeout plus the grace, is counted, and Redis did decide it
// (the key was charged): the price the counter shows. A Take whose client
// goes away during the grace returns at once and is not counted.
func TestLateReplyPastTheGrace(t *testing.T) {
	const timeout, latency = 50 * time.Millisecond, 150 * time.Millisecond
	for _, grace := range []time.Duration{0, 40 * time.Millisecond} {
		t.Run("grace "+grace.String(), func(t *testing.T) {
			srv, p, s := lateStore(t, timeout, grace)
			unknown0 := testutil.ToFloat64(s.unknown)
			req := algorithms.Request{Zone: "late", Key: freshKey(t), Limit: limit(t, 10, time.Hour, 0), Cost: 1}
			p.SetLatency(latency)
			if err := p.SetMode(faultproxy.Latency); err != nil {
				t.Fatal(err)
			}
			out := make([]algorithms.Decision, 1)
			el, err := timedTake(t, context.Background(), s, []algorithms.Request{req}, out)
			if !errors.As(err, new(*unknownError)) || !counts(err) {
				t.Fatalf("Take: %v; want an unknown decision (a timeout, which the breaker counts)", err)
			}
			if el < timeout+grace || el > timeout+grace+failMargin {
				t.Errorf("Take failed after %v; want the timeout %v plus the grace %v", el, timeout, grace)
			}
			if n := testutil.ToFloat64(s.unknown) - unknown0; n != 1 {
				t.Errorf("%v decisions counted unknown; want 1", n)
			}
			// Redis got the command and charged it: the decision was
			// made, only its reply was lost.
			key := s.Key(req.Zone, req.Key)
			deadline := time.Now().Add(2 * time.Second)
			for getRaw(t, srv.Client(), key) == "" {
				if time.Now().After(deadline) {
					t.Fatal("the late command never reached Redis")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if grace == 0 {
				return
			}

			// The client gone during the grace: the Take ends at once,
			// and says nothing about Redis. (On an open connection: the
			// one the late reply spoiled was dropped.)
			if err := p.SetMode(faultproxy.Pass); err != nil {
				t.Fatal(err)
			}
			if err := s.warm(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			if err := p.SetMode(faultproxy.Latency); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(timeout+grace/2, cancel)
			el, err = timedTake(t, ctx, s, []algorithms.Request{req}, out)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Take with the client gone: %v; want context.Canceled", err)
			}
			if el > timeout+grace/2+failMargin/2 {
				t.Errorf("Take with the client gone returned after %v; want at once", el)
			}
			if n := testutil.ToFloat64(s.unknown) - unknown0; n != 1 {
				t.Errorf("%v decisions counted unknown after the client went away; want still 1", n)
			}
		})
	}
}

// TestWarmOpensOneConnectionPerWorker: after warm, the pipeline pool holds
// one connection per pipeline worker and per spare (as many as the workers,
// within pool_size), so a fresh store's first burst, or a stall, dials
// nothing.
func TestWarmOpensOneConnectionPerWorker(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct{ workers, poolSize, want int }{{1, 0, 2}, {2, 0, 4}, {4, 0, 8}, {2, 3, 3}, {2, 1, 1}} {
		workers := tc.workers
		cfg := connConfig{URL: srv.URL(), Timeout: testTimeout, Prefix: DefaultKeyPrefix, Pipelines: workers, PoolSize: tc.poolSize}
		c, _, err := cfg.newClient()
		if err != nil {
			t.Fatal(err)
		}
		o := redisPathOptions()
		o.Workers = cfg.workers()
		s := newStoreWith(c, false, DefaultKeyPrefix, testTimeout, o)
		if err := s.warm(testCtx(t)); err != nil {
			t.Fatalf("warm: %v", err)
		}
		st := c.(interface{ PoolStats() *redis.PoolStats }).PoolStats().PipelineStats
		if st == nil || int(st.TotalConns) != tc.want {
			t.Errorf("%d workers, pool_size %d: the pipeline pool holds %+v after warm; want %d connections", workers, tc.poolSize, st, tc.want)
		}
		_ = s.Destruct()
	}
}

// TestLateReplyGraceOption: late_reply_grace parses (a duration, 0 or off
// to turn it off), defaults to DefaultLateReplyGrace, reaches the store's
// options and the connections' read timeout (timeout plus grace), and bad
// values (negative, above MaxLateReplyGrace, not a duration, missing,
// twice) are refused, in the Caddyfile and in JSON.
func TestLateReplyGraceOption(t *testing.T) {
	parse := func(in string) (*Redis, error) {
		r := new(Redis)
		err := r.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		return r, err
	}
	for in, want := range map[string]time.Duration{
		"redis redis://h:1": DefaultLateReplyGrace,
		"redis redis://h:1 {\n\tlate_reply_grace 250ms\n}":               250 * time.Millisecond,
		"redis redis://h:1 {\n\tlate_reply_grace 1s\n}":                  time.Second,
		"redis redis://h:1 {\n\tlate_reply_grace 0\n}":                   0,
		"redis redis://h:1 {\n\tlate_reply_grace off\n}":                 0,
		"redis redis://h:1 {\n\ttimeout 20ms\n\tlate_reply_grace 5ms\n}": 5 * time.Millisecond,
	} {
		r, err := parse(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if got := r.options().Grace; got != want {
			t.Errorf("%q: grace %v, want %v", in, got, want)
		}
	}
	for _, in := range []string{
		"redis redis://h:1 {\n\tlate_reply_grace -1ms\n}",
		"redis redis://h:1 {\n\tlate_reply_grace 2s\n}",
		"redis redis://h:1 {\n\tlate_reply_grace soon\n}",
		"redis redis://h:1 {\n\tlate_reply_grace\n}",
		"redis redis://h:1 {\n\tlate_reply_grace 10ms 20ms\n}",
		"redis redis://h:1 {\n\tlate_reply_grace 10ms\n\tlate_reply_grace 20ms\n}",
	} {
		if r, err := parse(in); err == nil {
			t.Errorf("accepted %q: grace %v", in, r.options().Grace)
		} else if !strings.Contains(err.Error(), "late_reply_grace") {
			t.Errorf("%q: error %q does not name late_reply_grace", in, err)
		}
	}
	for _, g := range []caddy.Duration{-1, caddy.Duration(MaxLateReplyGrace + 1)} {
		r := &Redis{URL: "redis://h:1", LateReplyGrace: &g}
		if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "late_reply_grace") {
			t.Errorf("JSON late_reply_grace %v: Validate %v, want an error naming it", time.Duration(g), err)
		}
	}
	// The pipeline connections may read until the timeout plus the grace.
	cfg := connConfig{URL: "redis://127.0.0.1:1", Timeout: 50 * time.Millisecond, Grace: 100 * time.Millisecond}
	c, _, err := cfg.newClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if o := c.(*redis.Client).Options(); o.ReadTimeout != 150*time.Millisecond || o.WriteTimeout != 50*time.Millisecond {
		t.Errorf("read timeout %v, write timeout %v; want 150ms and 50ms", o.ReadTimeout, o.WriteTimeout)
	}
}

// TestWarmClusterOpensConnectionsOnEveryMaster: a Cluster store's warm
// opens one pipeline connection per worker and per spare on every master.
func TestWarmClusterOpensConnectionsOnEveryMaster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s := newClusterStore(t, cl.Addrs(), testTimeout)
	if err := s.warm(testCtx(t)); err != nil {
		t.Fatalf("warm: %v", err)
	}
	err := s.Client().(*redis.ClusterClient).ForEachMaster(testCtx(t), func(ctx context.Context, c *redis.Client) error {
		if st := c.PoolStats().PipelineStats; st == nil || int(st.TotalConns) != 2*defaultWorkers {
			t.Errorf("master %s: the pipeline pool holds %+v after warm; want %d connections", c.Options().Addr, st, 2*defaultWorkers)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
