package caddytest_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestClusterSettleZoneShardDown: a request with zone A (fail open, its key
// on a healthy Cluster shard) and zone S (settle, fail local, its key on a
// frozen shard). S leaves a charge to settle with the store that decided
// it, so it is not decided apart: the request fails whole, A passes
// unmetered and S is decided and settled in this instance's memory. Each
// response reports 3 (the estimate is 1): of S's 10, sequential requests
// pass 4 times (1+3+3+3 settled, the fourth into debt). S decided in memory
// and settled in Redis would leave memory charged 1 a request: 10 pass.
func TestClusterSettleZoneShardDown(t *testing.T) {
	cl := redistest.StartClusterWith(t, redistest.ClusterConfig{Masters: 3, NodeTimeout: 30 * time.Second, Partial: true})
	tc := newTester(t)
	za, zs := zoneName("settle_span_a"), zoneName("settle_span_s")
	const lim, settled, want = 10, 3, 4
	load(t, tc, config("", fmt.Sprintf(`:@A@ {
	rate_limit {
		zone %s {
			key {http.request.header.X-A}
			events 1000
			window 1h
			fail open
		}
		zone %s {
			key {http.request.header.X-B}
			events %d
			window 1h
			settle header X-Used
			fail local
		}
		settle_wait 0
		store redis {
			cluster @ADDRS@
			timeout 200ms
		}
	}
	header X-Used %d
	respond "ok"
}`, za, zs, lim, settled), "ADDRS", strings.Join(cl.Addrs(), " ")))
	c := loopbackClient(2)
	const healthy, down = 0, 1
	keysOn := func(n *redistest.Server, zone string) int {
		v, _ := n.Do(t, "KEYS", "*"+zone+":*").([]any)
		return len(v)
	}
	var va, vb string
	for i := 0; i < 100 && (va == "" || vb == ""); i++ {
		a, b := fmt.Sprintf("a%d-%s", i, nonce), fmt.Sprintf("b%d-%s", i, nonce)
		beforeA, beforeB := keysOn(cl.Nodes[healthy], za), keysOn(cl.Nodes[down], zs)
		if r := get(t, c, siteA+"/", "X-A: "+a, "X-B: "+b); r.code != 200 {
			t.Fatalf("finding keys: %d %s", r.code, r.body)
		}
		if va == "" && keysOn(cl.Nodes[healthy], za) > beforeA {
			va = a
		}
		if vb == "" && keysOn(cl.Nodes[down], zs) > beforeB {
			vb = b
		}
	}
	if va == "" || vb == "" {
		t.Fatalf("no X-A on node %d (%q) or X-B on node %d (%q) in 100 tries", healthy, va, down, vb)
	}
	// vb's key in Redis was charged by the find; memory starts from zero.
	cl.Nodes[down].Freeze(t)
	defer cl.Nodes[down].Thaw(t)
	codes := map[int]int{}
	for range lim + 2 {
		codes[get(t, c, siteA+"/", "X-A: "+va, "X-B: "+vb).code]++
	}
	t.Logf("A open (healthy shard), S settle local (down shard): %v", codes)
	if codes[200] != want || codes[429] != lim+2-want {
		t.Errorf("statuses %v; want exactly %d of 200 (S's %d in memory, each settled to %d), the other %d 429",
			codes, want, lim, settled, lim+2-want)
	}
}
