package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/faultproxy"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// proxied starts a Redis behind a fault proxy and a store through the
// proxy with the given breaker (deny cache off unless denySize > 0).
func proxied(t *testing.T, o storeOptions) (*redistest.Server, *faultproxy.Proxy, *Store) {
	t.Helper()
	srv := redistest.Start(t)
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	cfg := connConfig{URL: "redis://" + p.Addr(), Timeout: DefaultTimeout, Prefix: DefaultKeyPrefix}
	c, _, err := cfg.newClient()
	if err != nil {
		t.Fatal(err)
	}
	o.Target = "test " + t.Name()
	s := newStoreWith(c, false, DefaultKeyPrefix, DefaultTimeout, o)
	t.Cleanup(func() { _ = s.Destruct() })
	return srv, p, s
}

func breakerOpts(failures int, cooldown, maxCooldown time.Duration) storeOptions {
	return storeOptions{Failures: failures, Cooldown: cooldown, MaxCooldown: maxCooldown}
}

func oneTake(s *Store, req algorithms.Request) (time.Duration, error) {
	out := make([]algorithms.Decision, 1)
	start := time.Now()
	err := s.Take(context.Background(), []algorithms.Request{req}, out)
	return time.Since(start), err
}

// TestBreakerOpensFailsFastProbesAndCloses drives the whole cycle through a
// stalled proxy: 5 timeouts open it; while open, Takes fail at once (far
// within the timeout) without a byte reaching the proxy; half-open lets
// exactly one of many concurrent Takes through (the probe); a failed probe
// doubles the cool-down; a probe that succeeds closes it.
func TestBreakerOpensFailsFastProbesAndCloses(t *testing.T) {
	const cooldown = 300 * time.Millisecond
	srv, p, s := proxied(t, breakerOpts(5, cooldown, 4*cooldown))
	req := algorithms.Request{Zone: "brk", Key: freshKey(t), Limit: limit(t, 1000, time.Hour, 0), Cost: 1}
	if _, err := oneTake(s, req); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	if err := p.SetMode(faultproxy.Stall); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		d, err := oneTake(s, req)
		if err == nil || errors.Is(err, ErrCircuitOpen) || d > DefaultTimeout+failMargin || kindOf(err) != "timeout" {
			t.Fatalf("stalled take %d: %v (kind %q) after %v, want a timeout within %v", i, err, kindOf(err), d, DefaultTimeout+failMargin)
		}
	}
	if st := s.CircuitState(); st != "open" {
		t.Fatalf("after 5 timeouts the circuit is %s, want open", st)
	}
	sent := p.Discarded() + p.Forwarded()
	var durs []time.Duration
	for i := range 1000 {
		d, err := oneTake(s, req)
		if !errors.Is(err, ErrCircuitOpen) || kindOf(err) != "circuit_open" {
			t.Fatalf("open, take %d: %v (kind %q), want ErrCircuitOpen", i, err, kindOf(err))
		}
		durs = append(durs, d)
	}
	sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
	t.Logf("1000 Takes while open: p50 %v, p99 %v, max %v", durs[500], durs[990], durs[999])
	// A Take that tried the stalled Redis would take the timeout; one that
	// does not returns at once (the bound is half the timeout, not a speed
	// target: a loaded machine's pauses stay well under it).
	if durs[999] > DefaultTimeout/2 {
		t.Errorf("a Take took %v while the circuit was open, want well under the timeout %v (no Redis call)", durs[999], DefaultTimeout)
	}
	if n := p.Discarded() + p.Forwarded() - sent; n != 0 {
		t.Errorf("%d chunks reached the proxy while the circuit was open", n)
	}

	// Half-open, still stalled: of 20 concurrent Takes exactly one probes.
	time.Sleep(cooldown + 20*time.Millisecond)
	discarded := p.Discarded()
	probes, fast := concurrentTakes(s, req, 20)
	if probes != 1 || fast != 19 {
		t.Fatalf("half-open, stalled: %d reached Redis, %d failed fast; want 1 and 19", probes, fast)
	}
	if n := p.Discarded() - discarded; n != 1 {
		t.Errorf("half-open: %d commands reached the stalled proxy, want exactly 1 (the probe)", n)
	}
	if st := s.CircuitState(); st != "open" {
		t.Fatalf("after a failed probe the circuit is %s, want open", st)
	}
	// The cool-down doubled: at 1.5× the first one it is still open.
	time.Sleep(cooldown * 3 / 2)
	if _, err := oneTake(s, req); !errors.Is(err, ErrCircuitOpen) {
		t.Fatalf("1.5 cool-downs after a failed probe: %v, want still open (the cool-down doubles)", err)
	}

	// Redis back, slow (15ms a chunk: a new connection's handshake and the script fit the timeout) so that the probe is still in flight while
	// the others arrive: the next probe (one of 20 concurrent) closes it.
	p.SetLatency(15 * time.Millisecond)
	if err := p.SetMode(faultproxy.Latency); err != nil {
		t.Fatal(err)
	}
	// A probe may meet a pooled connection the stall left dead and fail
	// (the cool-down doubles again): each round, exactly one Take probes.
	for round := 0; s.CircuitState() != "closed"; round++ {
		if round == 4 {
			t.Fatalf("4 probes with Redis back and the circuit still %s", s.CircuitState())
		}
		time.Sleep(time.Duration(s.breaker.until.Load()-monoNow()) + 20*time.Millisecond)
		calls := scriptCalls(t, srv)
		reached, fast := concurrentTakes(s, req, 20)
		n := scriptCalls(t, srv) - calls
		t.Logf("round %d with Redis back: %d Take reached Redis (%d script calls), %d failed fast; circuit %s", round, reached, n, fast, s.CircuitState())
		if reached != 1 || fast != 19 || n > 1 {
			t.Fatalf("half-open, healthy: %d reached Redis (%d script calls), %d failed fast; want 1 and 19", reached, n, fast)
		}
	}
	for i := range 10 {
		if _, err := oneTake(s, req); err != nil {
			t.Fatalf("closed again, take %d: %v", i, err)
		}
	}
}

// concurrentTakes runs n Takes at once and counts those that reached Redis
// (no ErrCircuitOpen) and those that failed fast.
func concurrentTakes(s *Store, req algorithms.Request, n int) (reached, fast int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := oneTake(s, req)
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, ErrCircuitOpen) {
				fast++
			} else {
				reached++
			}
		}()
	}
	close(start)
	wg.Wait()
	return reached, fast
}

// TestBreakerWhatCounts: refused and reset connections open it; errors
// about a key (WRONGTYPE) and callers that went away do not; a success
// resets the run.
// kindOf is the kind an error of Take names for the store errors metric
// (StoreErrorKind, as the handler finds it); "" for none.
func kindOf(err error) string {
	var k interface{ StoreErrorKind() string }
	if errors.As(err, &k) {
		return k.StoreErrorKind()
	}
	return ""
}

// TestStoreErrorKinds: each failure of Take names its kind, one of a
// bounded set (the kind label of caddy_rate_limit_store_errors_total).
func TestStoreErrorKinds(t *testing.T) {
	readonly := errors.New("READONLY You can't write against a read only replica.")
	for _, tc := range []struct {
		err  error
		want string
	}{
		{context.DeadlineExceeded, "timeout"},
		{errNotSent, "timeout"},
		{&unknownError{err: context.DeadlineExceeded}, "timeout"},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, "timeout"},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, "connection"},
		{readonly, "readonly"},
		{&loadError{readonly}, "readonly"},
		{errors.New("OOM command not allowed when used memory > 'maxmemory'."), "oom"},
		{errors.New("NOREPLICAS Not enough good replicas to write."), "noreplicas"},
		{errors.New("NOSCRIPT No matching script. Please use EVAL."), "noscript"},
		{errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"), "other"},
		{context.Canceled, "other"},
		{io.EOF, "other"},
	} {
		if got := kindOf(&storeError{tc.err}); got != tc.want {
			t.Errorf("%v: kind %q, want %q", tc.err, got, tc.want)
		}
	}
	if got := kindOf(fmt.Errorf("x: %w", &circuitError{msg: "open"})); got != "circuit_open" {
		t.Errorf("an open circuit: kind %q", got)
	}
}

func TestBreakerWhatCounts(t *testing.T) {
	for _, m := range []faultproxy.Mode{faultproxy.Refuse, faultproxy.Reset} {
		t.Run(m.String(), func(t *testing.T) {
			_, p, s := proxied(t, breakerOpts(3, time.Hour, time.Hour))
			req := algorithms.Request{Zone: "cnt", Key: freshKey(t), Limit: limit(t, 1000, time.Hour, 0), Cost: 1}
			if _, err := oneTake(s, req); err != nil {
				t.Fatal(err)
			}
			if err := p.SetMode(m); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if _, err := oneTake(s, req); err == nil || errors.Is(err, ErrCircuitOpen) {
					t.Fatalf("%v take %d: %v, want a connection error", m, i, err)
				}
			}
			if d, err := oneTake(s, req); !errors.Is(err, ErrCircuitOpen) {
				t.Fatalf("%v after 3 failures: %v after %v, want ErrCircuitOpen", m, err, d)
			} else {
				t.Logf("%v: the 4th Take fails fast: %v", m, err)
			}
		})
	}
	// A master whose min-replicas-to-write is not met refuses every write
	// (NOREPLICAS): counted, as READONLY is.
	t.Run("noreplicas", func(t *testing.T) {
		srv, _, s := proxied(t, breakerOpts(3, time.Hour, time.Hour))
		req := algorithms.Request{Zone: "cnt", Key: freshKey(t), Limit: limit(t, 1000, time.Hour, 0), Cost: 1}
		if _, err := oneTake(s, req); err != nil {
			t.Fatal(err)
		}
		srv.Do(t, "CONFIG", "SET", "min-replicas-to-write", "1")
		for i := range 3 {
			if _, err := oneTake(s, req); err == nil || !strings.Contains(err.Error(), "NOREPLICAS") {
				t.Fatalf("take %d with no replica: %v, want NOREPLICAS", i, err)
			}
		}
		if _, err := oneTake(s, req); !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("after 3 NOREPLICAS: %v, want ErrCircuitOpen", err)
		}
	})
	t.Run("not_counted", func(t *testing.T) {
		srv, _, s := proxied(t, breakerOpts(3, time.Hour, time.Hour))
		req := algorithms.Request{Zone: "cnt", Key: freshKey(t), Limit: limit(t, 1000, time.Hour, 0), Cost: 1}
		srv.Do(t, "LPUSH", s.Key(req.Zone, req.Key), "x")
		for i := range 10 {
			if _, err := oneTake(s, req); err == nil || errors.Is(err, ErrCircuitOpen) {
				t.Fatalf("WRONGTYPE take %d: %v, want the WRONGTYPE error, not the breaker", i, err)
			}
		}
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		good := algorithms.Request{Zone: "cnt", Key: freshKey(t), Limit: req.Limit, Cost: 1}
		out := make([]algorithms.Decision, 1)
		for i := range 10 {
			if err := s.Take(cancelled, []algorithms.Request{good}, out); errors.Is(err, ErrCircuitOpen) {
				t.Fatalf("cancelled take %d opened the circuit", i)
			}
		}
		if st := s.CircuitState(); st != "closed" {
			t.Fatalf("after WRONGTYPE and cancelled callers the circuit is %s, want closed", st)
		}
		if _, err := oneTake(s, good); err != nil {
			t.Fatal(err)
		}
	})
}

// TestBreakerRedisKilledAndRestarted: the real thing, without a proxy:
// redis-server killed, the breaker opens and fails fast, the server comes
// back, decisions resume within the cool-down plus a probe.
func TestBreakerRedisKilledAndRestarted(t *testing.T) {
	srv := redistest.Start(t)
	s := storeAt(t, srv.URL(), DefaultTimeout, breakerOpts(5, 200*time.Millisecond, time.Second))
	req := algorithms.Request{Zone: "kill", Key: freshKey(t), Limit: limit(t, 1000, time.Hour, 0), Cost: 1}
	if _, err := oneTake(s, req); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	var worst time.Duration
	opened := false
	for i := range 200 {
		d, err := oneTake(s, req)
		if err == nil {
			t.Fatalf("take %d succeeded with Redis killed", i)
		}
		worst = max(worst, d)
		if errors.Is(err, ErrCircuitOpen) {
			opened = true
		}
	}
	if !opened || worst > DefaultTimeout+failMargin {
		t.Fatalf("Redis killed: opened %v, slowest Take %v", opened, worst)
	}
	srv.Restart(t)
	back := time.Now()
	took, ok := time.Duration(0), false
	for time.Since(back) < 5*time.Second {
		if _, err := oneTake(s, req); err == nil {
			took, ok = time.Since(back), true
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !ok {
		t.Fatal("decisions did not resume within 5s of the restart")
	}
	t.Logf("Redis killed: slowest Take %v; decisions resumed %v after the restart", worst, took.Round(time.Millisecond))
}

// TestBreakerOneNodeStandalone: a standalone store is one node, labelled
// with the server's address, in Nodes (the admin API), its metrics and
// CircuitState, and its outage is counted there.
func TestBreakerOneNodeStandalone(t *testing.T) {
	srv := redistest.Start(t)
	r := &Redis{URL: srv.URL(), Breaker: &Breaker{Failures: 2, Cooldown: caddy.Duration(time.Minute)}}
	if err := r.Provision(caddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Cleanup() })
	s := r.Store
	req := algorithms.Request{Zone: "one", Key: freshKey(t), Limit: limit(t, 1000, time.Hour, 0), Cost: 1}
	if _, err := oneTake(s, req); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	if ns := s.Nodes(); len(ns) != 1 || ns[0] != (NodeState{Node: srv.Addr, Circuit: "closed"}) {
		t.Fatalf("Nodes() = %+v, want one closed node %s", ns, srv.Addr)
	}
	srv.Stop()
	for range 3 {
		_, _ = oneTake(s, req)
	}
	ns := s.Nodes()
	lv := []string{"redis", s.opts.Target, srv.Addr}
	state := testutil.ToFloat64(storeMetrics.circuitState.WithLabelValues(lv...))
	opens := testutil.ToFloat64(storeMetrics.circuitOpens.WithLabelValues(lv...))
	fails := testutil.ToFloat64(storeMetrics.circuitFailures.WithLabelValues(lv...))
	fast := testutil.ToFloat64(storeMetrics.fastFailures.WithLabelValues(lv...))
	want := NodeState{Node: srv.Addr, Circuit: "open", Outages: 1, Failures: 2, FastFailures: 1}
	if len(ns) != 1 || ns[0] != want || state != 2 || opens != 1 || fails != 2 || fast != 1 {
		t.Fatalf("after 2 failures and a fast one: Nodes() = %+v, want [%+v]; metrics state %v, opens %v, failures %v, fast %v", ns, want, state, opens, fails, fast)
	}
	if info := r.AdminInfo(); info["circuit"] != "open" || len(info["nodes"].([]NodeState)) != 1 {
		t.Fatalf("AdminInfo: circuit %v, nodes %v", info["circuit"], info["nodes"])
	}
}
