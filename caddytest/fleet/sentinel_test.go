package fleet_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

const sentinelRoutes = `rate_limit {
	zone s_open {
		key {http.request.header.X-User}
		events 5
		window 1h
		match {
			path /open*
		}
		fail open
	}
	zone s_bg {
		key {http.request.header.X-User}
		events 100000
		window 1h
		match {
			path /bg*
		}
		fail open
	}
	store redis %s
}
respond "ok"`

// TestSentinelFailover: Caddy configured with a redis+sentinel:// URL
// decides through the master the sentinel names (keys appear on it); after
// SENTINEL FAILOVER, decisions resume against the new master within 10 s
// with the counts that were replicated, keys are written on the new master,
// and the fail-open zones never answer an error or a 5xx meanwhile.
func TestSentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t)
	url := fmt.Sprintf("redis+sentinel://%s?master_name=%s", s.SentinelAddr, s.MasterName)
	p := startCaddy(t, "sentinel", "", fmt.Sprintf(sentinelRoutes, url))
	c := newClient(4)
	defer c.CloseIdleConnections()
	key := func(k string) string { return "X-User: " + k + "-" + nonce }

	for i := 0; i < 2; i++ {
		res := mustGet(t, c, p.url("/open"), key("K"))
		if expectCode(t, res, 200, fmt.Sprintf("before the failover #%d", i+1)) {
			expectRemaining(t, res, 5, 4-i, fmt.Sprintf("before the failover #%d", i+1))
		}
	}
	oldMaster := s.Master
	if n := len(scanKeys(t, oldMaster, "sluice:v1:s_open:{*}")); n != 1 {
		t.Fatalf("%d keys of zone s_open on the master %s, want 1", n, oldMaster.Addr)
	}

	bgClient := newClient(2)
	defer bgClient.CloseIdleConnections()
	bg := startTraffic(bgClient, 20*time.Millisecond, p.url("/bg"), func(i int) []string {
		return []string{key("bg-" + strconv.Itoa(i))}
	})
	bgStopped := false
	defer func() {
		if !bgStopped {
			bg.stop()
		}
	}()
	time.Sleep(200 * time.Millisecond)

	t0 := time.Now()
	s.Failover(t)
	failoverTook := time.Since(t0)
	if s.Master == oldMaster {
		t.Fatalf("Failover did not change the master")
	}
	t.Logf("failover %s -> %s took %v", oldMaster.Addr, s.Master.Addr, failoverTook.Round(time.Millisecond))

	// Decisions resume against the new master, with K's replicated count.
	var last result
	polls := 0
	took, ok := waitFor(10*time.Second, func() bool {
		polls++
		last = send(c, p.url("/open"), key("K"))
		return last.err == nil && last.decided()
	})
	if !ok {
		t.Fatalf("decisions did not resume within 10 s of the failover (last: %s)", last)
	}
	t.Logf("decisions resumed %v after Failover returned (%v after it started), %d polls", took.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), polls)
	if expectCode(t, last, 200, "K after the failover") {
		expectRemaining(t, last, 5, 2, "K after the failover (2 spent before it, replicated)")
	}

	res := mustGet(t, c, p.url("/open"), key("N"))
	if expectCode(t, res, 200, "new key after the failover") {
		expectRemaining(t, res, 5, 4, "new key after the failover")
	}
	if n := len(scanKeys(t, s.Master, "sluice:v1:s_open:{*}")); n != 2 {
		t.Errorf("%d keys of zone s_open on the new master %s, want 2 (K replicated, N written there)", n, s.Master.Addr)
	}
	if role := s.Master.Info(t, "replication")["role"]; role != "master" {
		t.Errorf("the new master %s reports role %q", s.Master.Addr, role)
	}

	// The background traffic keeps flowing a little longer, then: never an
	// error, never a 5xx; decided again at the end.
	time.Sleep(200 * time.Millisecond)
	results := bg.stop()
	bgStopped = true
	t.Logf("background traffic through the failover, %d requests: %v", len(results), tally(results))
	for i, r := range results {
		if r.err != nil || r.code != 200 {
			t.Errorf("background request %d on the fail-open zone: %s", i, r)
		}
	}
	if n := len(results); n > 0 && !results[n-1].decided() {
		t.Errorf("the last background request was not decided by Redis: %s", results[n-1])
	}
}
