package fleet_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// shardTraffic is the requests of one user (whose keys live on one
// Cluster master) to one Caddy, every interval, with when each ended.
type shardTraffic struct {
	proc, shard int
	path        string // a spanning request's route (shard -1)
	mu          sync.Mutex
	log         []timedResult
}

type timedResult struct {
	at time.Time
	result
}

// run sends GET url with headers every 20ms until stop is closed,
// recording each result.
func (s *shardTraffic) run(client *http.Client, url string, stop <-chan struct{}, wg *sync.WaitGroup, headers ...string) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 100000 {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			r := send(client, url, headers...)
			s.mu.Lock()
			s.log = append(s.log, timedResult{time.Now(), r})
			s.mu.Unlock()
		}
	}()
}

// between returns the results that ended in [from, to).
func (s *shardTraffic) between(from, to time.Time) []timedResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []timedResult
	for _, r := range s.log {
		if !r.at.Before(from) && r.at.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// TestClusterFleetShardFailure: three Caddy processes on a Cluster of 3
// masters with a replica each, a `fail closed` zone, requests flowing for
// a user on every master from every Caddy. A 2s DEBUG SLEEP on one master:
// the other masters' users get 200s, each well under the stall; the
// sleeping master's user gets its fail policy (503). Then kill -9 of a
// master: every Caddy serves its user again within 2s of the replica's
// promotion, and the other users never fail. The admin API shows the
// breaker per node. A request spanning a healthy and the sleeping master
// (zone A fail closed on the healthy one, B on the sleeping one) gets 200
// when B is fail open, 503 only when B is fail closed.
func TestClusterFleetShardFailure(t *testing.T) {
	c := redistest.StartClusterWith(t, redistest.ClusterConfig{Masters: 3, Replicas: 1, NodeTimeout: 3 * time.Second, Partial: true})
	const zone = "shards"
	addrs := strings.Join(c.Addrs(), " ")
	// /span and /span-closed: a request with zone A (key X-A) and zone B
	// (key X-B), B fail open on /span, fail closed on /span-closed.
	span := func(path, failA, failB string) string {
		return fmt.Sprintf(`handle %[1]s {
	rate_limit {
		zone %[2]s_a {
			key {http.request.header.X-A}
			events 1000000
			window 1h
			fail %[3]s
		}
		zone %[2]s_b {
			key {http.request.header.X-B}
			events 1000000
			window 1h
			fail %[4]s
		}
		store redis {
			cluster %[5]s
			timeout 250ms
		}
	}
	respond "ok"
}
`, path, strings.Trim(strings.ReplaceAll(path, "-", "_"), "/"), failA, failB, addrs)
	}
	routes := span("/span", "closed", "open") + span("/span-closed", "open", "closed") + fmt.Sprintf(`handle {
	rate_limit {
		zone %s {
			key {http.request.header.X-User}
			events 1000000
			window 1h
			fail closed
		}
		store redis {
			cluster %s
			timeout 250ms
		}
	}
	respond "ok"
}`, zone, addrs)
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("shards-%d", i), "", routes)
	}
	client := newClient(16)
	defer client.CloseIdleConnections()

	// A user per master: send a request, see which master got its key.
	users := make([]string, len(c.Nodes))
	found := 0
	for i := 0; found < len(c.Nodes) && i < 200; i++ {
		u := fmt.Sprintf("shard-user-%s-%d", nonce, i)
		expectCode(t, mustGet(t, client, procs[0].url("/"), "X-User: "+u), 200, "first request of "+u)
		for n, node := range c.Nodes {
			if users[n] == "" && len(scanKeys(t, node, "*"+zone+"*")) > 0 {
				for _, k := range scanKeys(t, node, "*"+zone+"*") {
					node.Do(t, "DEL", k)
				}
				users[n] = u
				found++
			}
		}
	}
	if found < len(c.Nodes) {
		t.Fatalf("users on %d of %d masters: %q", found, len(c.Nodes), users)
	}

	// A spanning request: A on master 2 (never sick), B on master 1 (the
	// sleeping one).
	const spanA, spanB = 2, 1
	var loads, spans []*shardTraffic
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()
	for p := range procs {
		for sh := range users {
			l := &shardTraffic{proc: p, shard: sh}
			loads = append(loads, l)
			l.run(client, procs[p].url("/"), stop, &wg, "X-User: "+users[sh])
		}
		for _, path := range []string{"/span", "/span-closed"} {
			l := &shardTraffic{proc: p, shard: -1, path: path}
			spans = append(spans, l)
			l.run(client, procs[p].url(path), stop, &wg, "X-A: "+users[spanA], "X-B: "+users[spanB])
		}
	}
	time.Sleep(500 * time.Millisecond)

	// healthyOK checks that the users of the masters other than sick got
	// only 200s from every Caddy in [from, to), each well under the stall.
	healthyOK := func(t *testing.T, sick int, from, to time.Time) {
		t.Helper()
		for _, l := range loads {
			rs := l.between(from, to)
			bad, slowest := 0, time.Duration(0)
			var sample []string
			for _, r := range rs {
				slowest = max(slowest, r.dur)
				if r.err != nil || r.code != 200 {
					bad++
					if len(sample) < 3 {
						sample = append(sample, r.String())
					}
				}
			}
			if l.shard == sick {
				continue
			}
			t.Logf("caddy %d, user of master %d: %d requests, %d not 200, slowest %v", l.proc, l.shard, len(rs), bad, slowest)
			if bad != 0 || len(rs) == 0 || slowest >= time.Second {
				t.Errorf("caddy %d, user of healthy master %d: %d of %d requests not 200 (%v), slowest %v; want every one 200, each under 1s",
					l.proc, l.shard, bad, len(rs), sample, slowest)
			}
		}
	}

	t.Run("stall", func(t *testing.T) {
		const sick = 1
		t0 := time.Now()
		if _, err := c.Nodes[sick].DoErr("DEBUG", "SLEEP", 2); err != nil {
			t.Fatalf("DEBUG SLEEP: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
		healthyOK(t, sick, t0, time.Now())
		// The spanning requests: A (fail closed, healthy master) decided,
		// B (fail open, sleeping master) passed: all 200, never waiting for
		// the stall; with B fail closed, 503s, and nothing else but 200s.
		for _, l := range spans {
			counts, slowest := map[int]int{}, time.Duration(0)
			for _, r := range l.between(t0, time.Now()) {
				counts[r.code]++
				slowest = max(slowest, r.dur)
			}
			t.Logf("caddy %d, %s (A on master %d, B on the sleeping master): %v, slowest %v", l.proc, l.path, spanA, counts, slowest)
			switch l.path {
			case "/span":
				if len(counts) != 1 || counts[200] == 0 || slowest >= time.Second {
					t.Errorf("caddy %d, /span: statuses %v, slowest %v; want only 200s (B fail open), each under 1s", l.proc, counts, slowest)
				}
			default:
				if counts[503] == 0 || len(counts) > 2 || len(counts) == 2 && counts[200] == 0 {
					t.Errorf("caddy %d, /span-closed: statuses %v; want 503s (B fail closed) and 200s only", l.proc, counts)
				}
			}
		}
		for _, l := range loads {
			if l.shard != sick {
				continue
			}
			counts := map[int]int{}
			for _, r := range l.between(t0, time.Now()) {
				counts[r.code]++
			}
			t.Logf("caddy %d, user of the sleeping master: %v", l.proc, counts)
			if counts[503] == 0 || len(counts) > 2 || len(counts) == 2 && counts[200] == 0 {
				t.Errorf("caddy %d, user of the sleeping master: statuses %v; want 503s (fail closed) and 200s only", l.proc, counts)
			}
		}
		// The admin API: the sleeping master's breaker had an outage, the
		// others none.
		for _, p := range procs {
			var z struct {
				Store struct {
					Nodes []struct {
						Node    string
						Circuit string
						Outages int64
					}
				}
			}
			r := mustGet(t, client, p.adminURL("/rate_limit/zones/"+zone))
			if err := json.Unmarshal([]byte(r.body), &z); err != nil {
				t.Fatalf("admin zone: %v: %s", err, r.body)
			}
			seen := 0
			for _, n := range z.Store.Nodes {
				for i, m := range c.Nodes {
					if n.Node != m.Addr {
						continue
					}
					seen++
					if (i == sick) != (n.Outages > 0) {
						t.Errorf("caddy %s: node %s (master %d, sleeping %v) had %d outages", p.name, n.Node, i, i == sick, n.Outages)
					}
				}
			}
			if seen != len(c.Nodes) {
				t.Errorf("caddy %s: admin API nodes %s; want each master", p.name, r.body)
			}
		}
		c.WaitHealthy(t)
	})

	t.Run("kill", func(t *testing.T) {
		const victim = 0
		replica := c.Replicas[victim][0]
		time.Sleep(1500 * time.Millisecond) // the sleeping master's breakers closed again
		t0 := time.Now()
		c.Nodes[victim].Kill()
		promoted := c.WaitPromoted(t, replica, 30*time.Second)
		t.Logf("killed %s; %s promoted %v later", c.Nodes[victim].Addr, replica.Addr, promoted.Sub(t0).Round(time.Millisecond))
		// SLUICE_FAILOVER_WAIT lengthens the wait, to measure a slow recovery.
		wait := 3 * time.Second
		if v, err := time.ParseDuration(os.Getenv("SLUICE_FAILOVER_WAIT")); err == nil {
			wait = v
		}
		time.Sleep(wait)
		stopLoad()
		healthyOK(t, victim, t0, time.Now())
		for _, l := range loads {
			if l.shard != victim {
				continue
			}
			var first time.Time
			fails := 0
			for _, r := range l.between(t0, time.Now()) {
				if r.err == nil && r.code == 200 && r.at.After(promoted) && first.IsZero() {
					first = r.at
				}
				if r.err != nil || r.code != 200 {
					fails++
				}
			}
			if first.IsZero() {
				t.Errorf("caddy %d: the killed master's user not served within %v of the promotion (%d failures)", l.proc, wait, fails)
				continue
			}
			t.Logf("caddy %d: the killed master's user served again %v after the promotion (%d failures since the kill)",
				l.proc, first.Sub(promoted).Round(time.Millisecond), fails)
			if first.Sub(promoted) > 2*time.Second {
				t.Errorf("caddy %d: served again %v after the promotion; want within 2s", l.proc, first.Sub(promoted))
			}
		}
	})
}
