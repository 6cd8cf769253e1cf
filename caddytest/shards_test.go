package caddytest_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestClusterSpanningShardsFailPolicies: a request with zone A (its key on a
// healthy Cluster shard) and zone B (its key on a frozen one). Site A: A
// fail closed, B fail open: A is decided by Redis alone (exactly its limit
// admitted among concurrent requests, the rest 429, never 503) and B
// passes. Site B: A fail open, B fail closed: every request answers 503
// (B's shard is down), and A is not charged by them. Site A /local: A fail
// closed, B fail local: B is decided in this instance's memory, A by
// Redis, and A's charges of the requests B refused are given back.
func TestClusterSpanningShardsFailPolicies(t *testing.T) {
	cl := redistest.StartClusterWith(t, redistest.ClusterConfig{Masters: 3, NodeTimeout: 30 * time.Second, Partial: true})
	tc := newTester(t)
	za1, zb1, za2, zb2 := zoneName("span_a"), zoneName("span_b"), zoneName("span_a"), zoneName("span_b")
	za3, zb3 := zoneName("span_a"), zoneName("span_b")
	const lim, localLim = 5, 3
	site := func(za, fa, zb, fb string, limB int) string {
		return fmt.Sprintf(`
	rate_limit {
		zone %s {
			key {http.request.header.X-A}
			events %d
			window 1h
			fail %s
		}
		zone %s {
			key {http.request.header.X-B}
			events %d
			window 1h
			fail %s
		}
		store redis {
			cluster @ADDRS@
			timeout 200ms
		}
	}
	respond "ok"`, za, lim, fa, zb, limB, fb)
	}
	load(t, tc, config("", ":@A@ {\nhandle /local {"+site(za3, "closed", zb3, "local", localLim)+"\n}\nhandle {"+site(za1, "closed", zb1, "open", 1000)+
		"\n}\n}\n:@B@ {"+site(za2, "open", zb2, "closed", 1000)+"\n}",
		"ADDRS", strings.Join(cl.Addrs(), " ")))
	c := loopbackClient(8)
	const healthy, down = 0, 1

	// nodeOfNew sends one request per value pair until it finds a value of
	// X-A whose key (zone za) lives on the healthy node and one of X-B
	// (zone zb) on the down node; each costs its zone one event.
	keysOn := func(n *redistest.Server, zone string) int {
		v, _ := n.Do(t, "KEYS", "*"+zone+":*").([]any)
		return len(v)
	}
	find := func(url, za, zb string) (va, vb string) {
		for i := 0; i < 100 && (va == "" || vb == ""); i++ {
			a, b := fmt.Sprintf("a%d-%s", i, nonce), fmt.Sprintf("b%d-%s", i, nonce)
			beforeA, beforeB := keysOn(cl.Nodes[healthy], za), keysOn(cl.Nodes[down], zb)
			if r := get(t, c, url, "X-A: "+a, "X-B: "+b); r.code != 200 {
				t.Fatalf("finding keys: %d %s", r.code, r.body)
			}
			if va == "" && keysOn(cl.Nodes[healthy], za) > beforeA {
				va = a
			}
			if vb == "" && keysOn(cl.Nodes[down], zb) > beforeB {
				vb = b
			}
		}
		if va == "" || vb == "" {
			t.Fatalf("no X-A on node %d (%q) or X-B on node %d (%q) in 100 tries", healthy, va, down, vb)
		}
		return va, vb
	}
	va1, vb1 := find(siteA+"/", za1, zb1)
	va2, vb2 := find(siteB+"/", za2, zb2)
	va3, vb3 := find(siteA+"/local", za3, zb3)

	cl.Nodes[down].Freeze(t)
	defer cl.Nodes[down].Thaw(t)
	const workers, each = 6, 4
	burst := func(url, va, vb string) map[int]int {
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					r := get(t, c, url, "X-A: "+va, "X-B: "+vb)
					mu.Lock()
					codes[r.code]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return codes
	}

	// Site A: the find spent one of A's events.
	codes := burst(siteA+"/", va1, vb1)
	t.Logf("A closed (healthy shard), B open (down shard): %v", codes)
	if codes[200] != lim-1 || codes[429] != workers*each-(lim-1) {
		t.Errorf("site A: statuses %v; want exactly %d of 200 (A's limit, one spent before), the other %d 429, no 503",
			codes, lim-1, workers*each-(lim-1))
	}

	codes = burst(siteB+"/", va2, vb2)
	t.Logf("A open (healthy shard), B closed (down shard): %v", codes)
	if codes[503] != workers*each {
		t.Errorf("site B: statuses %v; want all %d 503 (B fail closed, its shard down)", codes, workers*each)
	}
	// A fail closed (healthy shard), B fail local (down shard): B is
	// decided by this instance's memory (from zero: localLim admitted), A
	// by Redis; the requests B refused give A's charges back.
	codes = burst(siteA+"/local", va3, vb3)
	t.Logf("A closed (healthy shard), B local (down shard): %v", codes)
	if codes[200] != localLim || codes[429] != workers*each-localLim {
		t.Errorf("site A /local: statuses %v; want exactly %d of 200 (B's limit in memory), the other %d 429, no 503",
			codes, localLim, workers*each-localLim)
	}
	time.Sleep(300 * time.Millisecond) // the refunds, sent without waiting

	// The 503s charged A nothing: once the shard is back, A has what the
	// find left it, less this request.
	cl.Nodes[down].Thaw(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := get(t, c, siteB+"/", "X-A: "+va2, "X-B: "+vb2)
		if r.code == 200 {
			if got, want := r.header.Get("X-RateLimit-Remaining"), fmt.Sprint(lim-2); got != want {
				t.Errorf("site B after the thaw: A's X-RateLimit-Remaining %q, want %s (charged by the find and this request only)", got, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("site B: %d %s 10s after the thaw", r.code, r.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A of /local: charged by the find and the %d admitted only; this is
	// its last event.
	r := get(t, c, siteA+"/local", "X-A: "+va3, "X-B: "+vb3+"-fresh")
	if got := r.header.Get("X-RateLimit-Remaining"); r.code != 200 || got != "0" {
		t.Errorf("site A /local after the thaw: %d, X-RateLimit-Remaining %q; want 200 with 0 remaining (A charged by the find and the %d admitted only)", r.code, got, localLim)
	}
}
