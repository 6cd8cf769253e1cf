package fleet_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The asynchronous mode (zone setting sync, docs/redis.md): each instance
// decides a key from its count as last read plus its own charges since,
// and syncs every interval. Once every instance has read a key's count G,
// the key admits at most N + (I-1)(N-G) in its window; a key one instance
// uses is exact.

// syncRoutes is a fixed_window zone of events per hour keyed on X-User in
// the asynchronous mode, on store.
func syncRoutes(zone string, events int, store string) string {
	return fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		events %d
		window 1h
		algorithm fixed_window
		sync 20ms
	}
	store redis %s {
		timeout 250ms
	}
}
respond "ok"`, zone, events, store)
}

// syncView is a zone's asynchronous mode in the admin API.
type syncView struct {
	Sync *struct {
		Interval string `json:"interval"`
		Bound    string `json:"bound"`
		Keys     int    `json:"keys"`
		LagMs    int64  `json:"lag_ms"`
		Held     int64  `json:"held"`
		Failures int64  `json:"failures"`
	} `json:"sync"`
}

func syncOf(t *testing.T, c *http.Client, p *caddyProc, zone string) syncView {
	t.Helper()
	r := mustGet(t, c, p.adminURL("/rate_limit/zones/"+zone))
	var v syncView
	if err := json.Unmarshal([]byte(r.body), &v); err != nil || v.Sync == nil {
		t.Fatalf("caddy %s: admin zone %s: %v: %s", p.name, zone, err, r.body)
	}
	return v
}

// synced waits until every process has sent what it charged: its held
// units confirmed by a sync, which read the counts back.
func synced(t *testing.T, c *http.Client, procs []*caddyProc, zone string) {
	t.Helper()
	for _, p := range procs {
		if _, ok := waitFor(10*time.Second, func() bool {
			v := syncOf(t, c, p, zone)
			return v.Sync.Held == 0 && v.Sync.Failures == 0 && v.Sync.LagMs >= 0
		}); !ok {
			t.Fatalf("caddy %s: never synced: %+v", p.name, syncOf(t, c, p, zone).Sync)
		}
	}
}

// TestFleetSyncBound: three Caddy processes on one Redis, a zone of 30 per
// hour in the asynchronous mode. Each round, with a fresh key: one process
// alone admits 20 (exact: a key one instance uses), the others one each;
// once all have synced (each read G >= 20), 60 concurrent requests spread
// over the three admit at most 22 + 3 x (30 - 20) = 52 in all (the
// documented bound; deciding alone, each would admit up to its own 30:
// 90). Every request decided; Redis ends at the limit.
func TestFleetSyncBound(t *testing.T) {
	r := redistest.Start(t)
	const n, rounds = 30, 5
	routes := syncRoutes("sync_bound", n, r.URL())
	procs := make([]*caddyProc, exactProcs)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("sync-%d", i), "", routes)
	}
	client := newClient(60)
	defer client.CloseIdleConnections()
	for round := range rounds {
		user := fmt.Sprintf("sync-%s-%d", nonce, round)
		admitted := 0
		for i := range 20 {
			if res := send(client, procs[0].url("/"), "X-User: "+user); res.code != http.StatusOK {
				t.Fatalf("round %d: request %d on one instance: %s", round, i, res)
			}
			admitted++
		}
		synced(t, client, procs[:1], "sync_bound")
		for _, p := range procs[1:] {
			if res := send(client, p.url("/"), "X-User: "+user); res.code != http.StatusOK {
				t.Fatalf("round %d: caddy %s: %s", round, p.name, res)
			}
			admitted++
		}
		synced(t, client, procs, "sync_bound")
		before := admitted
		out := burst(t, client, procs, "/", 60, user)
		allowed, refused := countRound(t, round, out)
		admitted += allowed
		bound := before + exactProcs*(n-20)
		t.Logf("round %d: %d admitted before the burst, %d in all (bound %d), %d refused", round, before, admitted, bound, refused)
		if admitted > bound {
			t.Errorf("round %d: %d admitted, over the bound %d", round, admitted, bound)
		}
		if admitted < n {
			t.Errorf("round %d: %d admitted, under the limit %d", round, admitted, n)
		}
		synced(t, client, procs, "sync_bound")
		key := scanKeys(t, r, "*sync_bound:*")
		if len(key) == 0 {
			t.Fatalf("round %d: no key in Redis", round)
		}
	}
	v := syncOf(t, client, procs[0], "sync_bound")
	if v.Sync.Interval != "20ms" || v.Sync.Bound == "" {
		t.Errorf("admin view: %+v, want the interval and the bound", v.Sync)
	}
}

// TestFleetSyncOneInstanceExact: a key only one process of the fleet uses
// admits exactly its limit, 60 concurrent requests against 30.
func TestFleetSyncOneInstanceExact(t *testing.T) {
	r := redistest.Start(t)
	const n = 30
	routes := syncRoutes("sync_one", n, r.URL())
	procs := []*caddyProc{startCaddy(t, "sync-one-0", "", routes), startCaddy(t, "sync-one-1", "", routes)}
	client := newClient(60)
	defer client.CloseIdleConnections()
	for round := range 3 {
		out := burst(t, client, procs[:1], "/", 2*n, fmt.Sprintf("one-%s-%d", nonce, round))
		admitted := 0
		for i, res := range out {
			switch {
			case res.err != nil:
				t.Errorf("round %d: request %d: %v", round, i, res.err)
			case res.code == http.StatusOK:
				admitted++
			case res.code != http.StatusTooManyRequests:
				t.Errorf("round %d: request %d: %s", round, i, res)
			}
		}
		if admitted != n {
			t.Errorf("round %d: %d admitted, want exactly %d", round, admitted, n)
		}
	}
}
