package redisstore

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// shardLoad keeps Takes of one identity flowing and records each outcome.
type shardLoad struct {
	mu   sync.Mutex
	log  []takeEvent
	errs []error // the first few
}

type takeEvent struct {
	at  time.Time // when the Take returned
	dur time.Duration
	ok  bool
	err error
}

// run loops Take of key (always admitted: a limit nobody reaches) on s
// with workers goroutines until stop is closed.
func (l *shardLoad) run(t *testing.T, s *Store, key algorithms.Key, workers int, stop <-chan struct{}, wg *sync.WaitGroup) {
	req := []algorithms.Request{{Zone: "load", Key: key, Limit: limit(t, 1e9, time.Hour, 0), Cost: 1}}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Decision, 1)
			for {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
				start := time.Now()
				err := s.Take(context.Background(), req, out)
				end := time.Now()
				l.mu.Lock()
				l.log = append(l.log, takeEvent{at: end, dur: end.Sub(start), ok: err == nil && out[0].Allowed, err: err})
				if err != nil && len(l.errs) < 3 {
					l.errs = append(l.errs, err)
				}
				l.mu.Unlock()
			}
		}()
	}
}

// since returns the failures and the Takes recorded from t0 on, the
// slowest of them, and when the first success after from came (zero if
// none).
func (l *shardLoad) since(t0, from time.Time) (fails, n int, slowest time.Duration, firstOK time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.log {
		if e.at.Before(t0) {
			continue
		}
		n++
		if !e.ok {
			fails++
		}
		slowest = max(slowest, e.dur)
		if e.ok && firstOK.IsZero() && !from.IsZero() && e.at.After(from) {
			firstOK = e.at
		}
	}
	return
}

// failoverWait bounds the wait for a failed shard's keys to be served
// again after its replica's promotion (SLUICE_FAILOVER_WAIT overrides it,
// to measure a slow recovery).
func failoverWait(t *testing.T) time.Duration {
	if v := os.Getenv("SLUICE_FAILOVER_WAIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SLUICE_FAILOVER_WAIT: %v", err)
		}
		return d
	}
	return 10 * time.Second
}

// TestClusterShardFailure: a Cluster of 3 masters with a replica each,
// Takes flowing on a key of every shard. One master stalls (DEBUG SLEEP
// 2): the other shards' keys answer as if nothing happened. Then a master
// is killed (kill -9): its keys are served again within 2s of its
// replica's promotion, and the other shards' keys never fail.
func TestClusterShardFailure(t *testing.T) {
	// The node timeout outlasts the stall: the stalled master is not failed
	// over. Partial: between a master's failure and its replica's promotion
	// the other masters serve (with full coverage required, Redis answers
	// CLUSTERDOWN for every slot then: docs/redis.md).
	c := redistest.StartClusterWith(t, redistest.ClusterConfig{Masters: 3, Replicas: 1, NodeTimeout: 3 * time.Second, Partial: true})
	const timeout = 400 * time.Millisecond // above a busy -race machine's noise, far below the faults
	s := newClusterStore(t, c.Addrs(), timeout)
	keys := make([]algorithms.Key, len(c.Nodes))
	loads := make([]*shardLoad, len(c.Nodes))
	for i := range c.Nodes {
		keys[i] = keyOnNode(t, s, c, i)
		take(t, s, algorithms.Request{Zone: "load", Key: keys[i], Limit: limit(t, 1e9, time.Hour, 0), Cost: 1})
		loads[i] = &shardLoad{}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	for i := range c.Nodes {
		loads[i].run(t, s, keys[i], 2, stop, &wg)
	}
	time.Sleep(300 * time.Millisecond)

	t.Run("stall", func(t *testing.T) {
		const sick = 1
		t0 := time.Now()
		if _, err := c.Nodes[sick].DoErr("DEBUG", "SLEEP", 2); err != nil {
			t.Fatalf("DEBUG SLEEP: %v", err)
		}
		time.Sleep(500 * time.Millisecond) // and what follows it
		for i, l := range loads {
			fails, n, slowest, _ := l.since(t0, time.Time{})
			t.Logf("shard %d (%s) during and after the stall: %d Takes, %d failed, slowest %v", i, c.Nodes[i].Addr, n, fails, slowest)
			if i == sick {
				if fails == 0 {
					t.Errorf("shard %d stalled 2s and no Take failed", i)
				}
				if slowest > time.Second {
					t.Errorf("shard %d: a Take took %v, beyond its timeout %v and the grace", i, slowest, timeout)
				}
				continue
			}
			if fails != 0 || n == 0 || slowest >= time.Second {
				t.Errorf("shard %d (healthy): %d of %d Takes failed (%v), slowest %v; want none failed, each well under the 2s stall", i, fails, n, l.errs, slowest)
			}
		}
		// The breaker per node: the sick master's opened, the others' never;
		// so say Nodes (the admin API) and the metrics.
		byNode := map[string]NodeState{}
		for _, ns := range s.Nodes() {
			byNode[ns.Node] = ns
		}
		for i, n := range c.Nodes {
			ns, ok := byNode[n.Addr]
			opens := testutil.ToFloat64(storeMetrics.circuitOpens.WithLabelValues("redis", s.opts.Target, n.Addr))
			fails := testutil.ToFloat64(storeMetrics.circuitFailures.WithLabelValues("redis", s.opts.Target, n.Addr))
			t.Logf("node %s: %+v; metrics: %v opens, %v failures", n.Addr, ns, opens, fails)
			switch {
			case !ok:
				t.Errorf("Nodes() has no %s: %+v", n.Addr, s.Nodes())
			case i == sick && (ns.Outages < 1 || ns.Failures < 1 || opens != float64(ns.Outages) || fails != float64(ns.Failures)):
				t.Errorf("sick node %s: %+v, metrics %v opens %v failures; want an outage and failures, the same in both", n.Addr, ns, opens, fails)
			case i != sick && (ns.Outages != 0 || ns.Failures != 0 || ns.FastFailures != 0 || opens != 0 || fails != 0):
				t.Errorf("healthy node %s: %+v, metrics %v opens %v failures; want none", n.Addr, ns, opens, fails)
			}
		}
		c.WaitHealthy(t)
	})

	t.Run("kill", func(t *testing.T) {
		const victim = 0
		replica := c.Replicas[victim][0]
		time.Sleep(time.Second) // the sick shard's breaker closed again
		// The slot map reloads, as the surviving nodes count them.
		reloads := func() (n int64) {
			for i, m := range c.Nodes {
				if i != victim {
					n += m.CommandCount(t, "cluster|slots")
				}
			}
			for _, rs := range c.Replicas {
				for _, r := range rs {
					n += r.CommandCount(t, "cluster|slots")
				}
			}
			return n
		}
		reloads0 := reloads()
		t0 := time.Now()
		c.Nodes[victim].Kill()
		promoted := c.WaitPromoted(t, replica, 30*time.Second)
		t.Logf("killed %s; %s promoted %v later", c.Nodes[victim].Addr, replica.Addr, promoted.Sub(t0).Round(time.Millisecond))
		wait := failoverWait(t)
		var firstOK time.Time
		for deadline := promoted.Add(wait); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, _, _, firstOK = loads[victim].since(t0, promoted); !firstOK.IsZero() {
				break
			}
		}
		time.Sleep(500 * time.Millisecond)
		close(stop)
		wg.Wait()
		// Failures ask for a reload at most every 250ms.
		n, most := reloads()-reloads0, int64(time.Since(t0)/reloadEvery)+5
		t.Logf("%d slot map reloads in the %v since the kill", n, time.Since(t0).Round(time.Millisecond))
		if n < 1 || n > most {
			t.Errorf("%d slot map reloads since the kill; want 1 to %d (at most one per %v)", n, most, reloadEvery)
		}
		for i, l := range loads {
			fails, n, slowest, _ := l.since(t0, time.Time{})
			t.Logf("shard %d since the kill: %d Takes, %d failed, slowest %v", i, n, fails, slowest)
			if i != victim && (fails != 0 || n == 0) {
				l.mu.Lock()
				for _, e := range l.log {
					if !e.ok && !e.at.Before(t0) {
						t.Logf("  %v after the kill (took %v): %v", e.at.Sub(t0), e.dur, e.err)
					}
				}
				l.mu.Unlock()
				t.Errorf("shard %d (healthy): %d of %d Takes failed (%v); want none", i, fails, n, l.errs)
			}
		}
		if firstOK.IsZero() {
			t.Fatalf("the killed shard's key not served within %v of the promotion", wait)
		}
		rec := firstOK.Sub(promoted)
		t.Logf("the killed shard's key served again %v after the promotion", rec.Round(time.Millisecond))
		if rec > 2*time.Second {
			t.Errorf("recovery %v after the promotion; want within 2s", rec)
		}
		// The dead master's breaker is retired with it: nothing stays open.
		ns := s.Nodes()
		addrs := map[string]bool{}
		for _, n := range ns {
			addrs[n.Node] = true
		}
		if addrs[c.Nodes[victim].Addr] || !addrs[replica.Addr] || s.CircuitState() != "closed" {
			t.Errorf("after the failover: nodes %+v, circuit %s; want the replica's, not the dead master's, all closed", ns, s.CircuitState())
		}
	})

	// The soak (SLUICE_CLUSTER_SOAK=<rounds>): the dead master comes back
	// as a replica, the shard's master is killed again, and so on.
	t.Run("soak", func(t *testing.T) {
		rounds, _ := strconv.Atoi(os.Getenv("SLUICE_CLUSTER_SOAK"))
		if rounds <= 0 {
			t.Skip("SLUICE_CLUSTER_SOAK=<rounds> runs it")
		}
		const victim = 0
		stop := make(chan struct{})
		var wg sync.WaitGroup
		defer func() { close(stop); wg.Wait() }()
		for i := range loads {
			loads[i] = &shardLoad{}
			loads[i].run(t, s, keys[i], 2, stop, &wg)
		}
		dead, master := c.Nodes[victim], c.Replicas[victim][0]
		for round := range rounds {
			dead.Restart(t)
			c.WaitHealthy(t)
			time.Sleep(2 * time.Second) // its replication link up
			t0 := time.Now()
			master.Kill()
			promoted := c.WaitPromoted(t, dead, 30*time.Second)
			var firstOK time.Time
			for deadline := promoted.Add(failoverWait(t)); time.Now().Before(deadline) && firstOK.IsZero(); time.Sleep(20 * time.Millisecond) {
				_, _, _, firstOK = loads[victim].since(t0, promoted)
			}
			if firstOK.IsZero() {
				t.Fatalf("round %d: the killed shard's key not served after the promotion", round)
			}
			t.Logf("round %d: %s promoted %v after the kill; the shard's key served again %v after the promotion", round, dead.Addr,
				promoted.Sub(t0).Round(time.Millisecond), firstOK.Sub(promoted).Round(time.Millisecond))
			if firstOK.Sub(promoted) > 2*time.Second {
				t.Errorf("round %d: recovery %v after the promotion; want within 2s", round, firstOK.Sub(promoted))
			}
			for i, l := range loads {
				if fails, n, _, _ := l.since(t0, time.Time{}); i != victim && (fails != 0 || n == 0) {
					t.Errorf("round %d: shard %d (healthy): %d of %d Takes failed (%v)", round, i, fails, n, l.errs)
				}
			}
			dead, master = master, dead
		}
	})
}
