package redistest

import (
	"fmt"
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

// Cluster is a real Redis Cluster of masters without replicas.
type Cluster struct {
	Nodes []*Server
	// Slots[i] is the range of slots [lo, hi] owned by Nodes[i] at creation.
	Slots [][2]int

	closers closerSet
}

// StartCluster starts masters redis-server processes with cluster-enabled,
// joins them (CLUSTER SET-CONFIG-EPOCH, ADDSLOTSRANGE, MEET) with the 16384
// slots split evenly, and waits until every node reports cluster_state:ok
// with all slots assigned and all nodes known. Stopped at t's cleanup.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 1 {
		t.Fatalf("redistest: StartCluster: %d masters", masters)
	}
	c := &Cluster{}
	for range masters {
		n := startNode(t, "redis-server", func(s *Server) []string {
			// The bus port is picked, not port+10000, which may be taken
			// or beyond 65535.
			s.BusPort = FreePort(t)
			return []string{
				"cluster-enabled yes",
				"cluster-config-file nodes.conf",
				"cluster-node-timeout 2000",
				fmt.Sprintf("cluster-port %d", s.BusPort),
			}
		})
		c.Nodes = append(c.Nodes, n)
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
	for _, n := range c.Nodes[1:] {
		c.Nodes[0].Do(t, "CLUSTER", "MEET", "127.0.0.1", n.Port, n.BusPort)
	}
	c.WaitHealthy(t)
	return c
}

// WaitHealthy waits (bounded) until every running node reports
// cluster_state:ok, all 16384 slots assigned and ok, and knows every node.
// Use it after restarting a node.
func (c *Cluster) WaitHealthy(t testing.TB) {
	t.Helper()
	waitUntil(t, clusterTimeout, "cluster state ok on every node", func() (bool, string) {
		var states []string
		ok := true
		for _, n := range c.Nodes {
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
				info["cluster_known_nodes"] == strconv.Itoa(len(c.Nodes))
			ok = ok && nodeOK
			states = append(states, fmt.Sprintf("%s: state=%s assigned=%s ok=%s known=%s", n.Addr,
				info["cluster_state"], info["cluster_slots_assigned"], info["cluster_slots_ok"], info["cluster_known_nodes"]))
		}
		return ok, strings.Join(states, "; ")
	}, c.Nodes...)
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
