package redistest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterTimeout bounds the wait for a new cluster to agree on its state.
// A master's state stays "fail" for a rejoin delay of cluster-node-timeout
// (2 s here) after it starts, so creation takes a little over 2 s.
const clusterTimeout = 15 * time.Second

const clusterSlots = 16384

// Cluster is a real Redis Cluster: masters, each with its replicas.
type Cluster struct {
	// Nodes are the masters at creation.
	Nodes []*Server
	// Slots[i] is the range of slots [lo, hi] owned by Nodes[i] at creation.
	Slots [][2]int
	// Replicas[i] are the replicas of Nodes[i] (nil without replicas).
	Replicas [][]*Server

	closers closerSet
}

// ClusterConfig shapes a cluster (StartClusterWith).
type ClusterConfig struct {
	Masters int
	// Replicas is the number of replicas per master.
	Replicas int
	// NodeTimeout is cluster-node-timeout: how long a master must be
	// unreachable before it is failed and a replica takes over. Default 2s.
	NodeTimeout time.Duration
	// Partial sets cluster-require-full-coverage no: while a master is
	// failed and not yet replaced, the other masters go on serving their
	// slots (else every node answers CLUSTERDOWN).
	Partial bool
}

// StartCluster starts masters redis-server processes with cluster-enabled,
// joins them (CLUSTER SET-CONFIG-EPOCH, ADDSLOTSRANGE, MEET) with the 16384
// slots split evenly, and waits until every node reports cluster_state:ok
// with all slots assigned and all nodes known. Stopped at t's cleanup.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterConfig{Masters: masters})
}

// StartClusterWith starts a cluster as StartCluster does, with cfg.Replicas
// replicas per master (CLUSTER REPLICATE, waited for until in sync), which
// take over a failed master after cfg.NodeTimeout whatever their data's age
// (cluster-replica-validity-factor 0).
func StartClusterWith(t testing.TB, cfg ClusterConfig) *Cluster {
	t.Helper()
	masters := cfg.Masters
	if masters < 1 || cfg.Replicas < 0 {
		t.Fatalf("redistest: StartCluster: %d masters, %d replicas", masters, cfg.Replicas)
	}
	timeout := cfg.NodeTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	coverage := "yes"
	if cfg.Partial {
		coverage = "no"
	}
	start := func() *Server {
		return startNode(t, "redis-server", func(s *Server) []string {
			// The bus port is picked, not port+10000, which may be taken
			// or beyond 65535.
			s.BusPort = FreePort(t)
			return []string{
				"cluster-require-full-coverage " + coverage,
				"cluster-enabled yes",
				"cluster-config-file nodes.conf",
				fmt.Sprintf("cluster-node-timeout %d", timeout.Milliseconds()),
				"cluster-replica-validity-factor 0",
				fmt.Sprintf("cluster-port %d", s.BusPort),
			}
		})
	}
	c := &Cluster{}
	for range masters {
		c.Nodes = append(c.Nodes, start())
	}
	for range c.Nodes {
		var rs []*Server
		for range cfg.Replicas {
			rs = append(rs, start())
		}
		c.Replicas = append(c.Replicas, rs)
	}
	t.Cleanup(c.closers.closeAll) // runs before the nodes stop
	for i, n := range c.Nodes {
		lo := i * clusterSlots / masters
		hi := (i+1)*clusterSlots/masters - 1
		c.Slots = append(c.Slots, [2]int{lo, hi})
		// Distinct epochs spare the nodes the collision-resolution round.
		n.Do(t, "CLUSTER", "SET-CONFIG-EPOCH", i+1)
		n.Do(t, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
	}
	for _, n := range c.all()[1:] {
		c.Nodes[0].Do(t, "CLUSTER", "MEET", "127.0.0.1", n.Port, n.BusPort)
	}
	for i, rs := range c.Replicas {
		id := c.Nodes[i].Do(t, "CLUSTER", "MYID").(string)
		for _, r := range rs {
			// A replica can follow a master once it has heard of it.
			waitUntil(t, clusterTimeout, "replica "+r.Addr+" replicating "+c.Nodes[i].Addr, func() (bool, string) {
				_, err := r.DoErr("CLUSTER", "REPLICATE", id)
				return err == nil, fmt.Sprint(err)
			}, r)
		}
	}
	c.WaitHealthy(t)
	for i, rs := range c.Replicas {
		for _, r := range rs {
			waitInSyncUntil(t, r, c.Nodes[i], clusterTimeout)
		}
	}
	return c
}

// all returns every node: masters then replicas.
func (c *Cluster) all() []*Server {
	all := slices.Clone(c.Nodes)
	for _, rs := range c.Replicas {
		all = append(all, rs...)
	}
	return all
}

// WaitHealthy waits (bounded) until every running node reports
// cluster_state:ok, all 16384 slots assigned and ok, and knows every node.
// Use it after restarting a node.
func (c *Cluster) WaitHealthy(t testing.TB) {
	t.Helper()
	all := c.all()
	waitUntil(t, clusterTimeout, "cluster state ok on every node", func() (bool, string) {
		var states []string
		ok := true
		for _, n := range all {
			if !n.Running() {
				continue
			}
			v, err := n.DoErr("CLUSTER", "INFO")
			if err != nil {
				ok = false
				states = append(states, fmt.Sprintf("%s: %v", n.Addr, err))
				continue
			}
			s, _ := v.(string)
			info := parseInfo(s)
			nodeOK := info["cluster_state"] == "ok" &&
				info["cluster_slots_assigned"] == strconv.Itoa(clusterSlots) &&
				info["cluster_slots_ok"] == strconv.Itoa(clusterSlots) &&
				info["cluster_known_nodes"] == strconv.Itoa(len(all))
			ok = ok && nodeOK
			states = append(states, fmt.Sprintf("%s: state=%s assigned=%s ok=%s known=%s", n.Addr,
				info["cluster_state"], info["cluster_slots_assigned"], info["cluster_slots_ok"], info["cluster_known_nodes"]))
		}
		return ok, strings.Join(states, "; ")
	}, all...)
}

// Addrs returns the nodes' addresses, to seed a cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Client returns a new go-redis cluster client seeded with every node,
// closed at the cleanup of the test that started the cluster.
func (c *Cluster) Client() *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	c.closers.add(cc)
	return cc
}

// NodeForKey returns the node that owns key's slot (CLUSTER KEYSLOT, which
// honours {hash tags}), by the slot ranges assigned at creation.
func (c *Cluster) NodeForKey(t testing.TB, key string) *Server {
	t.Helper()
	var slot int64 = -1
	for _, n := range c.Nodes {
		if v, err := n.DoErr("CLUSTER", "KEYSLOT", key); err == nil {
			slot, _ = v.(int64)
			break
		}
	}
	for i, r := range c.Slots {
		if int64(r[0]) <= slot && slot <= int64(r[1]) {
			return c.Nodes[i]
		}
	}
	t.Fatalf("redistest: no node for key %q (slot %d; is every node down?)", key, slot)
	return nil
}

// WaitPromoted waits (bounded by timeout) until CLUSTER NODES on a running
// node other than replica shows replica as a master that owns slots, and
// returns when it first saw it (polled every 10 ms): the promotion as the
// rest of the cluster knows it.
func (c *Cluster) WaitPromoted(t testing.TB, replica *Server, timeout time.Duration) time.Time {
	t.Helper()
	var seen time.Time
	waitEvery(t, timeout, 10*time.Millisecond, replica.Addr+" promoted to master", func() (bool, string) {
		for _, n := range c.all() {
			if n == replica || !n.Running() {
				continue
			}
			v, err := n.DoErr("CLUSTER", "NODES")
			if err != nil {
				continue
			}
			s, _ := v.(string)
			for _, line := range strings.Split(s, "\n") {
				f := strings.Fields(line)
				// <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
				if len(f) < 9 || !strings.HasPrefix(f[1], replica.Addr+"@") {
					continue
				}
				if slices.Contains(strings.Split(f[2], ","), "master") {
					seen = time.Now()
					return true, line
				}
				return false, line
			}
		}
		return false, "no running node answers CLUSTER NODES"
	}, c.all()...)
	return seen
}
