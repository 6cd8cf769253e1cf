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

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// What a failover may cost in exactness (docs/redis.md, "Failover"): the
// decisions the new master never saw. The tests below count them per key:
// paced load on a few keys with a budget never reached (a token bucket that
// refills one token in days), then lost = admitted − spent, where spent is
// what the new master's state says (limit − remaining). A key with limit L
// is admitted at most L + lost.

const (
	lossKeys      = 4                     // keys under load
	lossPerKey    = 2                     // goroutines per key
	lossPace      = 10 * time.Millisecond // between two decisions of one goroutine
	lossBudget    = 100_000               // a key's limit: never reached
	lossInFlight  = lossPerKey            // decisions of a key in flight at any instant
	sentinelBound = 10                    // lost per key, manual failover, healthy link: docs/redis.md
)

// lossLoad is paced decisions on lossKeys keys, counting what was admitted.
type lossLoad struct {
	s        *Store
	reqs     []algorithms.Request
	admitted [lossKeys]atomic.Int64
	failed   atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
}

// startLossLoad starts the load on keys that keep accepts (by the key's
// name in Redis; nil: any).
func startLossLoad(t *testing.T, s *Store, keep func(string) bool) *lossLoad {
	t.Helper()
	l := &lossLoad{s: s, stop: make(chan struct{})}
	lim := limit(t, lossBudget, 10_000*time.Hour, 0)
	for len(l.reqs) < lossKeys {
		r := algorithms.Request{Zone: "loss", Key: freshKey(t), Limit: lim, Cost: 1}
		if keep == nil || keep(s.Key(r.Zone, r.Key)) {
			l.reqs = append(l.reqs, r)
		}
	}
	for k := range lossKeys {
		for range lossPerKey {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				tick := time.NewTicker(lossPace)
				defer tick.Stop()
				out := make([]algorithms.Decision, 1)
				for {
					select {
					case <-l.stop:
						return
					case <-tick.C:
					}
					err := s.Take(context.Background(), l.reqs[k:k+1], out)
					switch {
					case err != nil:
						l.failed.Add(1)
					case out[0].Allowed:
						l.admitted[k].Add(1)
					}
				}
			}()
		}
	}
	t.Cleanup(l.end)
	return l
}

// end stops the load and waits for it (idempotent).
func (l *lossLoad) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

func (l *lossLoad) snapshot() (n [lossKeys]int64) {
	for k := range n {
		n[k] = l.admitted[k].Load()
	}
	return n
}

// decidedSince waits (bounded) until every key has had n more decisions
// admitted than in from.
func (l *lossLoad) decidedSince(t *testing.T, from [lossKeys]int64, n int64, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for k := 0; k < lossKeys; {
		if l.admitted[k].Load() >= from[k]+n {
			k++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: key %d had %d decisions admitted in %v, want %d (%d failed in all)",
				what, k, l.admitted[k].Load()-from[k], within, n, l.failed.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lost stops the load and returns, per key, the decisions admitted that the
// master's state does not count: one more Take per key reads it.
func (l *lossLoad) lost(t *testing.T) (lost [lossKeys]int64) {
	t.Helper()
	l.end()
	for k := range lossKeys {
		var out []algorithms.Decision
		for attempt := 0; ; attempt++ {
			o := make([]algorithms.Decision, 1)
			err := l.s.Take(context.Background(), l.reqs[k:k+1], o)
			if err == nil {
				out = o
				break
			}
			if attempt == 100 {
				t.Fatalf("reading key %d after the failover: %v", k, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		spent := lossBudget - out[0].Remaining
		lost[k] = l.admitted[k].Load() + 1 - spent
	}
	return lost
}

// sentinelStore provisions a store on ss the way Caddy does, with the
// default decision timeout, given the address of one sentinel.
func sentinelStore(t *testing.T, ss *redistest.SentinelSet, sentinel string) *Redis {
	t.Helper()
	m := &Redis{URL: "redis+sentinel://" + sentinel + "?master_name=" + ss.MasterName, Timeout: caddy.Duration(DefaultTimeout)}
	if err := m.Provision(caddyContext(t)); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	t.Cleanup(func() { _ = m.Cleanup() })
	return m
}

// TestSentinelManualFailoverLoss: SENTINEL FAILOVER under load, on a healthy
// link (every write replicated before the promotion): decisions stop reaching
// the old master when the replica is promoted, so a key loses at most
// sentinelBound decisions (the old master, still a master until it is
// reconfigured, answers those sent to it after the promotion; the new one
// never sees them).
func TestSentinelManualFailoverLoss(t *testing.T) {
	ss := redistest.StartSentinel(t)
	manualFailoverLoss(t, ss, ss.SentinelAddr)
}

// TestSentinelLeaderDiscoveredLoss: TestSentinelManualFailoverLoss with 3
// sentinels, the store given only the address of one that does not run the
// failover: it must find the others (SENTINEL SENTINELS) to see the
// promotion start.
func TestSentinelLeaderDiscoveredLoss(t *testing.T) {
	ss := redistest.StartSentinels(t, 3)
	manualFailoverLoss(t, ss, ss.Sentinels[1].Addr) // ss.Failover asks ss.Sentinels[0]
}

func manualFailoverLoss(t *testing.T, ss *redistest.SentinelSet, sentinel string) {
	m := sentinelStore(t, ss, sentinel)
	load := startLossLoad(t, m.Store, nil)
	load.decidedSince(t, [lossKeys]int64{}, 20, 10*time.Second, "before the failover")

	oldMaster := ss.Master
	ss.Failover(t)
	if ss.Master == oldMaster {
		t.Fatal("Failover did not swap the master")
	}
	load.decidedSince(t, load.snapshot(), 20, 10*time.Second, "after the failover")

	lost := load.lost(t)
	t.Logf("admitted per key %v, lost per key %v (bound %d), %d failed", load.snapshot(), lost, sentinelBound, load.failed.Load())
	for k, n := range lost {
		if n > sentinelBound {
			t.Errorf("key %d: %d decisions admitted that the new master never saw, want ≤ %d", k, n, sentinelBound)
		}
	}
}

// TestSentinelKillLaggingLoss: kill -9 of the master while its replica lags
// (CLIENT PAUSE WRITE on the replica: it reads the replication stream but
// applies none of it, and the stream read but not applied is dropped with
// the master's link). What the new master lacks is what the old one
// acknowledged during the lag, and no more: a key loses at most the
// decisions admitted between the pause and the kill (plus those in flight
// as the pause began), whatever the client does; after the promotion no
// decision is lost.
func TestSentinelKillLaggingLoss(t *testing.T) {
	ss := redistest.StartSentinel(t)
	m := sentinelStore(t, ss, ss.SentinelAddr)
	load := startLossLoad(t, m.Store, nil)
	load.decidedSince(t, [lossKeys]int64{}, 20, 10*time.Second, "before the lag")

	oldMaster, replica := ss.Master, ss.Replica
	replica.Do(t, "CLIENT", "PAUSE", "20000", "WRITE")
	atPause := load.snapshot()
	load.decidedSince(t, atPause, 20, 10*time.Second, "during the lag")
	oldMaster.Kill()
	atKill := load.snapshot()
	time.Sleep(200 * time.Millisecond) // the replica drops its link, and what it had not applied
	replica.Do(t, "CLIENT", "UNPAUSE")

	load.decidedSince(t, atKill, 20, 30*time.Second, "after the promotion")
	if role := replica.Info(t, "replication")["role"]; role != "master" {
		t.Fatalf("the replica %s reports role %q after decisions resumed", replica.Addr, role)
	}
	lost := load.lost(t)
	t.Logf("admitted per key during the lag %v, lost per key %v, %d failed", sub(atKill, atPause), lost, load.failed.Load())
	for k, n := range lost {
		if bound := atKill[k] - atPause[k] + lossInFlight; n > bound {
			t.Errorf("key %d: %d decisions admitted that the new master never saw, want ≤ %d (admitted during the lag, and in flight)", k, n, bound)
		}
	}
}

func sub(a, b [lossKeys]int64) (d [lossKeys]int64) {
	for k := range d {
		d[k] = a[k] - b[k]
	}
	return d
}

// TestClusterTakeoverLaggingLoss: a Cluster replica that lags (CLIENT PAUSE
// WRITE) takes its master's slots over (CLUSTER FAILOVER TAKEOVER) while
// the master still runs, under load on keys of that master. A key loses at
// most what the old master acknowledged from the start of the lag until it
// learned of the takeover (and turned replica: it answers MOVED then), plus
// what was in flight; the client follows MOVED to the new master.
func TestClusterTakeoverLaggingLoss(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	master := c.Nodes[0]
	replica := startClusterReplica(t, master)
	s := newClusterStore(t, c.Addrs(), DefaultTimeout)
	load := startLossLoad(t, s, func(key string) bool { return c.NodeForKey(t, key) == master })
	load.decidedSince(t, [lossKeys]int64{}, 20, 10*time.Second, "before the lag")

	replica.Do(t, "CLIENT", "PAUSE", "20000", "WRITE")
	atPause := load.snapshot()
	load.decidedSince(t, atPause, 20, 10*time.Second, "during the lag")
	replica.Do(t, "CLUSTER", "FAILOVER", "TAKEOVER")
	replica.Do(t, "CLIENT", "UNPAUSE")
	deadline := time.Now().Add(10 * time.Second)
	for master.Info(t, "replication")["role"] != "slave" {
		if time.Now().After(deadline) {
			t.Fatalf("the old master %s did not turn replica within 10 s of the takeover; CLUSTER NODES on the replica:\n%v\non the master:\n%v\nreplica log:\n%s\nmaster log:\n%s",
				master.Addr, replica.Do(t, "CLUSTER", "NODES"), master.Do(t, "CLUSTER", "NODES"), replica.LogTail(), master.LogTail())
		}
		time.Sleep(5 * time.Millisecond)
	}
	atDemoted := load.snapshot()

	load.decidedSince(t, atDemoted, 20, 20*time.Second, "after the takeover")
	lost := load.lost(t)
	t.Logf("admitted per key from the lag to the demotion %v, lost per key %v, %d failed", sub(atDemoted, atPause), lost, load.failed.Load())
	for k, n := range lost {
		if bound := atDemoted[k] - atPause[k] + lossInFlight; n > bound {
			t.Errorf("key %d: %d decisions admitted that the new master never saw, want ≤ %d (admitted from the lag to the demotion, and in flight)", k, n, bound)
		}
	}
}

// startClusterReplica starts a Cluster node, joins it to master's cluster
// as master's replica, and waits until it has acknowledged master's writes
// and knows the cluster's nodes and epoch (a takeover must beat the
// master's epoch).
func startClusterReplica(t *testing.T, master *redistest.Server) *redistest.Server {
	t.Helper()
	bus := redistest.FreePort(t)
	r := redistest.Start(t, "cluster-enabled yes", "cluster-config-file nodes.conf", "cluster-node-timeout 2000", fmt.Sprintf("cluster-port %d", bus))
	r.BusPort = bus
	master.Do(t, "CLUSTER", "MEET", "127.0.0.1", r.Port, bus)
	id, _ := master.Do(t, "CLUSTER", "MYID").(string)
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := r.DoErr("CLUSTER", "REPLICATE", id) // fails until r knows master
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CLUSTER REPLICATE %s on %s: %v", id, r.Addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		info := r.Info(t, "replication")
		mine, theirs := clusterInfo(t, r), clusterInfo(t, master)
		if info["master_link_status"] == "up" && mine["cluster_current_epoch"] == theirs["cluster_current_epoch"] &&
			mine["cluster_known_nodes"] == theirs["cluster_known_nodes"] {
			if n, err := master.DoErr("WAIT", 1, 1000); err == nil && n == int64(1) {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica %s is not in sync with %s: %v", r.Addr, master.Addr, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func clusterInfo(t *testing.T, n *redistest.Server) map[string]string {
	t.Helper()
	s, _ := n.Do(t, "CLUSTER", "INFO").(string)
	m := map[string]string{}
	for line := range strings.Lines(s) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}
