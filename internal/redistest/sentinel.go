package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterName is the name the sentinel of a SentinelSet monitors.
const MasterName = "mymaster"

const (
	// sentinelTimeout bounds StartSentinel's waits (sync, discovery).
	sentinelTimeout = 15 * time.Second
	// failoverTimeout bounds Failover.
	failoverTimeout = 20 * time.Second
)

// SentinelSet is a master, one replica of it, and redis-sentinels
// monitoring the master (one with quorum 1, or n with a majority quorum:
// StartSentinels). Restarting a member reuses the config
// it was started with (the first replica's says replicaof the first master);
// the sentinel reconfigures a returning member that disagrees with it.
type SentinelSet struct {
	MasterName   string // "mymaster"
	SentinelAddr string // "127.0.0.1:<port>" of the sentinel
	// Master and Replica are the current master and replica: Failover swaps
	// them.
	Master, Replica *Server
	// Sentinel is the first sentinel: Failover asks it; Sentinels are all.
	Sentinel  *Server
	Sentinels []*Server

	closers closerSet
}

// StartSentinel starts a master, a replica (replicaof the master) and a
// sentinel (down-after-milliseconds 1000, failover-timeout 3000), and waits
// until the replica is in sync (master_link_status:up) and the sentinel
// reports the master and knows the replica as a healthy one. All stopped at
// t's cleanup, the sentinel first.
func StartSentinel(t testing.TB) *SentinelSet {
	t.Helper()
	return StartSentinels(t, 1)
}

// StartSentinels is StartSentinel with n sentinels, quorum n/2+1, and waits
// until each knows the others (they find each other through the master).
func StartSentinels(t testing.TB, n int) *SentinelSet {
	t.Helper()
	if n < 1 {
		t.Fatalf("redistest: StartSentinels: %d sentinels", n)
	}
	master := Start(t)
	replica := Start(t, fmt.Sprintf("replicaof 127.0.0.1 %d", master.Port))
	waitInSync(t, replica, master)
	waitReplicated(t, master, sentinelTimeout, replica)
	s := &SentinelSet{MasterName: MasterName, Master: master, Replica: replica}
	for range n {
		s.Sentinels = append(s.Sentinels, startNode(t, "redis-sentinel", func(*Server) []string {
			// The sentinel rewrites this file (myid, known replicas, epochs);
			// it lives in the sentinel's own temp dir, writable.
			return []string{
				fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d", MasterName, master.Port, n/2+1),
				"sentinel down-after-milliseconds " + MasterName + " 1000",
				"sentinel failover-timeout " + MasterName + " 3000",
			}
		}))
	}
	s.Sentinel, s.SentinelAddr = s.Sentinels[0], s.Sentinels[0].Addr
	t.Cleanup(s.closers.closeAll)
	s.waitSentinelView(t, sentinelTimeout)
	if n > 1 {
		all := append([]*Server{master, replica}, s.Sentinels...)
		waitUntil(t, sentinelTimeout, "the sentinels know each other", func() (bool, string) {
			var seen []string
			ok := true
			for _, sn := range s.Sentinels {
				v, err := sn.DoErr("SENTINEL", "SENTINELS", s.MasterName)
				others, _ := v.([]any)
				seen = append(seen, fmt.Sprintf("%s knows %d (%v)", sn.Addr, len(others), err))
				ok = ok && err == nil && len(others) == n-1
			}
			return ok, strings.Join(seen, "; ")
		}, all...)
	}
	return s
}

// URL returns the failover URL of the set, for redis.ParseFailoverURL:
// redis://127.0.0.1:<sentinel port>?master_name=mymaster.
func (s *SentinelSet) URL() string {
	return fmt.Sprintf("redis://%s?master_name=%s", s.SentinelAddr, s.MasterName)
}

// FailoverClient returns a new go-redis failover client for the set,
// closed at the cleanup of the test that started the set.
func (s *SentinelSet) FailoverClient() *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    s.MasterName,
		SentinelAddrs: []string{s.SentinelAddr},
	})
	s.closers.add(c)
	return c
}

// Failover asks the sentinel to fail over (SENTINEL FAILOVER mymaster) and
// waits until it reports the former replica as the master and that server
// answers ROLE as master. It then makes the former master a replica of the
// new one at once (the sentinel would do the same about 8 s later: until
// then the old master would still accept writes), waits until it is in sync
// and known to the sentinel, and swaps Master and Replica, so Failover can be
// called again. Bounded (about 20 s).
func (s *SentinelSet) Failover(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(failoverTimeout)
	oldMaster, newMaster := s.Master, s.Replica
	all := []*Server{s.Sentinel, oldMaster, newMaster}
	// Every write acknowledged so far reaches the replica before it is
	// promoted (replication is asynchronous; SENTINEL FAILOVER does not wait).
	waitReplicated(t, oldMaster, time.Until(deadline), newMaster)
	waitUntil(t, time.Until(deadline), "SENTINEL FAILOVER accepted", func() (bool, string) {
		// NOGOODSLAVE or INPROG while the sentinel's view settles: retry.
		_, err := s.Sentinel.DoErr("SENTINEL", "FAILOVER", s.MasterName)
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	}, all...)
	waitUntil(t, time.Until(deadline), "sentinel reports the former replica as master", func() (bool, string) {
		addr := s.masterAddr()
		role := roleOf(newMaster.Addr)
		return addr == newMaster.Addr && role == "master",
			fmt.Sprintf("sentinel says master is %s, %s answers ROLE %s", addr, newMaster.Addr, role)
	}, all...)
	oldMaster.Do(t, "REPLICAOF", "127.0.0.1", strconv.Itoa(newMaster.Port))
	s.Master, s.Replica = newMaster, oldMaster
	waitInSyncUntil(t, oldMaster, newMaster, time.Until(deadline))
	waitReplicated(t, newMaster, time.Until(deadline), oldMaster)
	s.waitSentinelView(t, time.Until(deadline))
}

// masterAddr is the sentinel's answer to get-master-addr-by-name, or the
// error text.
func (s *SentinelSet) masterAddr() string {
	v, err := s.Sentinel.DoErr("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName)
	if err != nil {
		return "error: " + err.Error()
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return fmt.Sprintf("unexpected reply %v", v)
	}
	return fmt.Sprintf("%v:%v", a[0], a[1])
}

// waitSentinelView waits until the sentinel reports s.Master as the master
// and lists s.Replica as a replica with no flag but "slave" and its link up,
// which SENTINEL FAILOVER needs.
func (s *SentinelSet) waitSentinelView(t testing.TB, timeout time.Duration) {
	t.Helper()
	waitUntil(t, timeout, "sentinel knows the master and the replica", func() (bool, string) {
		if addr := s.masterAddr(); addr != s.Master.Addr {
			return false, "sentinel says master is " + addr + ", want " + s.Master.Addr
		}
		v, err := s.Sentinel.DoErr("SENTINEL", "REPLICAS", s.MasterName)
		if err != nil {
			return false, "SENTINEL REPLICAS: " + err.Error()
		}
		replicas, _ := v.([]any)
		var seen []string
		for _, r := range replicas {
			f := pairs(r)
			seen = append(seen, fmt.Sprintf("%s:%s flags=%s link=%s", f["ip"], f["port"], f["flags"], f["master-link-status"]))
			if f["port"] == strconv.Itoa(s.Replica.Port) && f["flags"] == "slave" && f["master-link-status"] == "ok" {
				return true, ""
			}
		}
		return false, "replicas: [" + strings.Join(seen, "; ") + "]"
	}, s.Sentinel, s.Master, s.Replica)
}

// replicationBarrierKey is written and deleted by waitReplicated.
const replicationBarrierKey = "redistest:replication-barrier"

// waitReplicated waits until a replica has acknowledged every write the
// master has accepted so far: on one connection it writes (SET then DEL of
// replicationBarrierKey, which leaves the keyspace as it was) and runs
// WAIT 1. master_link_status:up alone is not enough: after a full sync the
// master only starts streaming once the replica's first REPLCONF ACK comes,
// up to a second later, and a failover in between loses the writes.
func waitReplicated(t testing.TB, master *Server, timeout time.Duration, replica *Server) {
	t.Helper()
	waitUntil(t, timeout, "replica "+replica.Addr+" acknowledges the writes of "+master.Addr, func() (bool, string) {
		c := helperClient(master.Addr)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		defer cancel()
		conn := c.Conn()
		defer conn.Close()
		if err := conn.Set(ctx, replicationBarrierKey, "1", 0).Err(); err != nil {
			return false, "SET: " + err.Error()
		}
		if err := conn.Del(ctx, replicationBarrierKey).Err(); err != nil {
			return false, "DEL: " + err.Error()
		}
		n, err := conn.Do(ctx, "WAIT", 1, 1000).Int64()
		if err != nil {
			return false, "WAIT: " + err.Error()
		}
		return n >= 1, fmt.Sprintf("WAIT 1 1000 answered %d", n)
	}, master, replica)
}

// pairs turns a RESP2 flat array [k1 v1 k2 v2 ...] into a map.
func pairs(v any) map[string]string {
	m := map[string]string{}
	a, _ := v.([]any)
	for i := 0; i+1 < len(a); i += 2 {
		m[fmt.Sprint(a[i])] = fmt.Sprint(a[i+1])
	}
	return m
}

func waitInSync(t testing.TB, replica, master *Server) {
	t.Helper()
	waitInSyncUntil(t, replica, master, sentinelTimeout)
}

// waitInSyncUntil waits until replica reports role:slave of master with
// master_link_status:up.
func waitInSyncUntil(t testing.TB, replica, master *Server, timeout time.Duration) {
	t.Helper()
	waitUntil(t, timeout, replica.Addr+" in sync with "+master.Addr, func() (bool, string) {
		v, err := replica.DoErr("INFO", "replication")
		if err != nil {
			return false, err.Error()
		}
		str, _ := v.(string)
		info := parseInfo(str)
		return info["role"] == "slave" && info["master_port"] == strconv.Itoa(master.Port) && info["master_link_status"] == "up",
			fmt.Sprintf("role=%s master_port=%s master_link_status=%s", info["role"], info["master_port"], info["master_link_status"])
	}, replica, master)
}
