package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStandaloneSetGet(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	s := Start(t)
	t.Logf("standalone start: %v", time.Since(t0))
	if !strings.HasPrefix(s.Addr, "127.0.0.1:") || s.URL() != "redis://"+s.Addr {
		t.Fatalf("addr %q url %q", s.Addr, s.URL())
	}
	ctx := ctxT(t)
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k = %q, %v", got, err)
	}
	if got := s.Do(t, "GET", "k"); got != "v" {
		t.Fatalf("Do GET k = %v", got)
	}
	if got := s.Do(t, "GET", "missing"); got != nil {
		t.Fatalf("Do GET missing = %v, want nil", got)
	}
	// Defaults: nothing on disk, loopback only.
	if got := s.Do(t, "CONFIG", "GET", "save").([]any); got[1] != "" {
		t.Fatalf("save = %v", got)
	}
	if got := s.Do(t, "CONFIG", "GET", "bind").([]any); got[1] != "127.0.0.1" {
		t.Fatalf("bind = %v", got)
	}
	// The URL works with go-redis.
	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	c2 := redis.NewClient(opt)
	defer c2.Close()
	if got, err := c2.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k via URL = %q, %v", got, err)
	}
}

func TestExtraConfig(t *testing.T) {
	t.Parallel()
	s := Start(t, "maxmemory 10mb", "hz 20")
	if got := s.Do(t, "CONFIG", "GET", "maxmemory").([]any); got[1] != "10485760" {
		t.Fatalf("maxmemory = %v", got)
	}
}

func TestStopRestartSamePort(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := ctxT(t)
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	port, dir := s.Port, s.Dir

	s.Stop()
	if s.Running() {
		t.Fatal("running after Stop")
	}
	if _, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
		t.Fatal("port still accepts after Stop")
	}
	if _, err := s.DoErr("PING"); err == nil {
		t.Fatal("PING succeeded against a stopped server")
	}
	s.Stop() // idempotent

	t0 := time.Now()
	s.Restart(t)
	t.Logf("restart: %v", time.Since(t0))
	if s.Port != port || s.Dir != dir || !s.Running() {
		t.Fatalf("restart moved: port %d->%d dir %s->%s running %v", port, s.Port, dir, s.Dir, s.Running())
	}
	// The same client reconnects; nothing was persisted.
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k after restart: %v, want redis.Nil", err)
	}
	if err := c.Set(ctx, "k", "v2", 0).Err(); err != nil {
		t.Fatal(err)
	}

	// Kill (a crash) and restart too.
	s.Kill()
	if s.Running() {
		t.Fatal("running after Kill")
	}
	s.Restart(t)
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING = %v", got)
	}
}

func TestFreezeThaw(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	ctx := ctxT(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s.Freeze(t)
	t0 := time.Now()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered by a frozen server")
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("frozen PING took %v", d)
	}
	s.Thaw(t)
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING after thaw = %v", got)
	}
	// Stop works on a frozen server (cleanup would do the same).
	s.Freeze(t)
	t0 = time.Now()
	s.Stop()
	t.Logf("stop of a frozen server: %v", time.Since(t0))
}

func TestFaultInjection(t *testing.T) {
	t.Parallel()
	a := Start(t)
	b := Start(t)
	ctx := ctxT(t)
	c := a.Client()

	// CommandCount via commandstats.
	sha := a.Do(t, "SCRIPT", "LOAD", "return redis.call('INCR', KEYS[1])").(string)
	before := a.CommandCount(t, "evalsha")
	for range 3 {
		if err := c.EvalSha(ctx, sha, []string{"n"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.CommandCount(t, "evalsha") - before; got != 3 {
		t.Fatalf("evalsha calls = %d, want 3", got)
	}
	if got := a.CommandStats(t, "never-called"); got != (CommandStats{}) {
		t.Fatalf("never-called = %+v", got)
	}
	// NOSCRIPT counts as a call that failed.
	if err := c.EvalSha(ctx, "0000000000000000000000000000000000000000", []string{"n"}).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Fatalf("EVALSHA unknown: %v", err)
	}
	if got := a.CommandStats(t, "EVALSHA"); got.Calls != before+4 || got.Failed != 1 || got.Rejected != 0 {
		t.Fatalf("evalsha stats after NOSCRIPT = %+v", got)
	}

	// ConnectedClients counts the pool plus the asking connection.
	base := a.ConnectedClients(t)
	extra := redis.NewClient(&redis.Options{Addr: a.Addr})
	defer extra.Close()
	if err := extra.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got := a.ConnectedClients(t); got != base+1 {
		t.Fatalf("connected clients = %d, want %d", got, base+1)
	}

	// OOM.
	a.SetOOM(t)
	err := c.Set(ctx, "x", "y", 0).Err()
	if err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("SET under OOM: %v", err)
	}
	err = c.EvalSha(ctx, sha, []string{"n"}).Err()
	if err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("EVALSHA under OOM: %v", err)
	}
	t.Logf("EVALSHA under OOM: %v", err)
	// Refused before running: the SET; inside the script: the INCR, while
	// the EVALSHA ran and failed.
	if got := a.CommandStats(t, "set"); got.Rejected != 1 {
		t.Fatalf("set stats under OOM = %+v, want 1 rejected", got)
	}
	if got := a.CommandStats(t, "incr"); got.Rejected != 1 {
		t.Fatalf("incr stats under OOM = %+v, want 1 rejected", got)
	}
	if got := a.CommandStats(t, "evalsha"); got.Failed != 2 {
		t.Fatalf("evalsha stats under OOM = %+v, want 2 failed", got)
	}
	a.ClearOOM(t)
	if err := c.Set(ctx, "x", "y", 0).Err(); err != nil {
		t.Fatalf("SET after ClearOOM: %v", err)
	}

	// READONLY.
	a.MakeReadOnlyReplicaOf(t, b)
	err = c.Set(ctx, "x", "y", 0).Err()
	if err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("SET on a replica: %v", err)
	}
	a.MakeMaster(t)
	if err := c.Set(ctx, "x", "y", 0).Err(); err != nil {
		t.Fatalf("SET after MakeMaster: %v", err)
	}
}

func TestStartRetriesTakenPort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	attempts := 0
	s := startNode(t, "redis-server", func(*Server) []string {
		attempts++
		if attempts == 1 {
			return []string{fmt.Sprintf("port %d", taken)} // overrides the picked port
		}
		return nil
	})
	if attempts != 2 || s.Port == taken {
		t.Fatalf("attempts %d, port %d (taken %d)", attempts, s.Port, taken)
	}
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING = %v", got)
	}
}

func TestFreePortDistinct(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	for range 50 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d twice", p)
		}
		seen[p] = true
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	cl := StartCluster(t, 3)
	t.Logf("3-master cluster start: %v", time.Since(t0))
	if len(cl.Addrs()) != 3 {
		t.Fatalf("addrs %v", cl.Addrs())
	}
	ctx := ctxT(t)
	c := cl.Client()
	perNode := map[string]int{}
	slots := map[int64]bool{}
	for i := range 300 {
		key := fmt.Sprintf("key-%d", i)
		if err := c.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		slot := cl.Nodes[0].Do(t, "CLUSTER", "KEYSLOT", key).(int64)
		slots[slot] = true
		n := cl.NodeForKey(t, key)
		perNode[n.Addr]++
		// The key is really on the node NodeForKey names.
		if got := n.Do(t, "EXISTS", key); got != int64(1) {
			t.Fatalf("%s not on %s", key, n.Addr)
		}
	}
	if len(slots) < 250 || len(perNode) != 3 {
		t.Fatalf("keys spread over %d slots and %d nodes", len(slots), len(perNode))
	}
	for i := range 300 {
		key := fmt.Sprintf("key-%d", i)
		if got, err := c.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("GET %s = %d, %v", key, got, err)
		}
	}
	// A hash-tagged multi-key script runs on one node.
	if err := c.Eval(ctx, "redis.call('SET', KEYS[1], 1); return redis.call('SET', KEYS[2], 2)",
		[]string{"a:{user}", "b:{user}"}).Err(); err != nil {
		t.Fatal(err)
	}

	// A node comes back after a restart, with its slots.
	n := cl.NodeForKey(t, "key-0")
	n.Stop()
	t0 = time.Now()
	n.Restart(t)
	cl.WaitHealthy(t)
	t.Logf("cluster node restart to healthy: %v", time.Since(t0))
	if err := c.Set(ctx, "key-0", "again", 0).Err(); err != nil {
		t.Fatalf("SET after node restart: %v", err)
	}
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	ss := StartSentinel(t)
	t.Logf("sentinel set start: %v", time.Since(t0))
	if ss.MasterName != "mymaster" || ss.URL() != "redis://"+ss.SentinelAddr+"?master_name=mymaster" {
		t.Fatalf("name %q url %q", ss.MasterName, ss.URL())
	}
	opt, err := redis.ParseFailoverURL(ss.URL())
	if err != nil {
		t.Fatal(err)
	}
	if opt.MasterName != "mymaster" || len(opt.SentinelAddrs) != 1 || opt.SentinelAddrs[0] != ss.SentinelAddr {
		t.Fatalf("parsed %+v", opt)
	}
	c := redis.NewFailoverClient(opt)
	defer c.Close()
	ctx := ctxT(t)
	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := ss.Master.Do(t, "GET", "before"); got != "1" {
		t.Fatalf("master GET before = %v", got)
	}
	oldMaster, oldReplica := ss.Master, ss.Replica

	t0 = time.Now()
	ss.Failover(t)
	t.Logf("failover: %v", time.Since(t0))
	if ss.Master != oldReplica || ss.Replica != oldMaster {
		t.Fatal("Master and Replica not swapped")
	}
	if r := roleOf(ss.Master.Addr); r != "master" {
		t.Fatalf("new master ROLE %s", r)
	}
	if r := roleOf(ss.Replica.Addr); r != "slave" {
		t.Fatalf("old master ROLE %s", r)
	}

	// Writes through the failover client reach the new master. The client
	// learns of the switch from the sentinel (+switch-master), so allow it
	// a moment, bounded.
	t0 = time.Now()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := c.Set(ctx, "after", "2", 0).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SET through failover client after failover: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("failover client writing again after %v", time.Since(t0))
	if got := ss.Master.Do(t, "GET", "after"); got != "2" {
		t.Fatalf("new master GET after = %v", got)
	}
	if got := ss.Master.Do(t, "GET", "before"); got != "1" {
		t.Fatalf("new master GET before = %v (replication lost it)\n%s\n%s\n%s", got, ss.Master.logTailBlock(), ss.Replica.logTailBlock(), ss.Sentinel.logTailBlock())
	}
	// The old master refuses writes now.
	if _, err := ss.Replica.DoErr("SET", "x", "y"); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("SET on old master: %v", err)
	}
	// FailoverClient follows the sentinel too.
	if err := ss.FailoverClient().Set(ctx, "via-helper", "3", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// And a second failover works.
	t0 = time.Now()
	ss.Failover(t)
	t.Logf("second failover: %v", time.Since(t0))
	if ss.Master != oldMaster {
		t.Fatal("second failover did not return to the first master")
	}
}
