package fleet_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

const reloadRoutes = `rate_limit {
	zone rl_traffic {
		key {http.request.header.X-User}
		events 100000
		window 1h
		match {
			path /t*
		}
	}
	zone rl_limit {
		key {http.request.header.X-User}
		events %d
		window 1h
		match {
			path /l*
		}
	}
	store redis %s {
		pool_size %d
		timeout 250ms
	}
}
respond "%s"`

// clientIDs returns the ids of the connections to s (CLIENT LIST), leaving
// out the connection that asks.
func clientIDs(t *testing.T, s *redistest.Server) []int64 {
	t.Helper()
	list, _ := s.Do(t, "CLIENT", "LIST").(string)
	var ids []int64
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if line == "" || strings.Contains(line, " cmd=client|list ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("CLIENT LIST: bad id in %q", line)
				}
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// TestReloadKeepsPool: one Caddy and Redis; traffic, then config reloads
// through the admin /load endpoint (a different respond body, the same
// store) with traffic in between. The connections to Redis are the same
// ones before and after every reload (CLIENT LIST ids) and never more than
// the pool (pool_size 4, with bursts of 6 concurrent requests to fill it).
// A changed limit applies at once after a reload: events 3 exhausted, then
// events 10: the next 7 requests pass.
//
// The store's timeout is 250ms here: go-redis closes a connection whose
// read timed out and dials another, and such churn under the default
// (see TestExactFleet*) would read as a reload that dropped the pool.
func TestReloadKeepsPool(t *testing.T) {
	const pool = 4
	r := redistest.Start(t)
	routes := func(events int, body string) string {
		return fmt.Sprintf(reloadRoutes, events, r.URL(), pool, body)
	}
	p := startCaddy(t, "reload", "", routes(3, "v0"))
	c := newClient(8)
	defer c.CloseIdleConnections()
	seq := 0
	key := func() string { seq++; return "X-User: t-" + nonce + "-" + strconv.Itoa(seq) }

	traffic := func(phase string) {
		t.Helper()
		for i := 0; i < 20; i++ {
			res := sendAfterReload(t, c, p.url("/t"), key())
			if expectCode(t, res, 200, phase+": sequential") && !res.decided() {
				t.Errorf("%s: sequential #%d not decided by Redis: %s", phase, i, res)
			}
		}
		for b := 0; b < 3; b++ {
			seq++
			for i, res := range burst(t, c, []*caddyProc{p}, "/t", 6, fmt.Sprintf("burst-%s-%d", nonce, seq)) {
				if res.err != nil || res.code != 200 {
					t.Errorf("%s: burst %d #%d: %s", phase, b, i, res)
				}
			}
		}
	}
	type sample struct {
		phase     string
		connected int // INFO clients connected_clients, minus the asking connection
		ids       []int64
	}
	var samples []sample
	measure := func(phase string) sample {
		t.Helper()
		s := sample{phase: phase, connected: r.ConnectedClients(t) - 1, ids: clientIDs(t, r)}
		samples = append(samples, s)
		// pool_size bounds the pipeline connections decisions use (one
		// per pipeline and one per spare, opened at start); the command
		// pool keeps the startup check's and the deny cache watcher's.
		if len(s.ids) > pool+2 {
			t.Errorf("%s: %d connections to Redis %v, want at most the pool (%d) + 2", phase, len(s.ids), s.ids, pool)
		}
		return s
	}

	traffic("before any reload")
	first := measure("before any reload")
	if len(first.ids) == 0 {
		t.Fatalf("no connection to Redis after traffic")
	}

	const reloads = 5
	for i := 1; i <= reloads; i++ {
		body := "v" + strconv.Itoa(i)
		p.reload(t, "", routes(3, body))
		var last result
		if _, ok := waitFor(5*time.Second, func() bool {
			last = sendAfterReload(t, c, p.url("/t"), key())
			return last.err == nil && last.body == body
		}); !ok {
			t.Fatalf("reload %d: the new config does not serve within 5 s (last: %s)", i, last)
		}
		traffic("after reload " + strconv.Itoa(i))
		s := measure("after reload " + strconv.Itoa(i))
		// Every connection the pool had before the reloads is still
		// open: the reload reused them, it did not dial a new pool.
		for _, id := range first.ids {
			if !slices.Contains(s.ids, id) {
				t.Errorf("after reload %d: connection id=%d of the pool before the reloads is gone (now %v): the reload did not keep the pool", i, id, s.ids)
			}
		}
	}

	// A changed limit applies at once: 3 spent of events 3, then events 10.
	limitKey := "X-User: limit-" + nonce
	for i := 0; i < 3; i++ {
		res := sendAfterReload(t, c, p.url("/l"), limitKey)
		if expectCode(t, res, 200, fmt.Sprintf("events 3: #%d", i+1)) {
			expectRemaining(t, res, 3, 2-i, fmt.Sprintf("events 3: #%d", i+1))
		}
	}
	expectCode(t, sendAfterReload(t, c, p.url("/l"), limitKey), 429, "events 3: #4")
	p.reload(t, "", routes(10, "v-limit"))
	if _, ok := waitFor(5*time.Second, func() bool {
		return sendAfterReload(t, c, p.url("/t"), key()).body == "v-limit"
	}); !ok {
		t.Fatalf("the events 10 config does not serve within 5 s")
	}
	for i := 0; i < 7; i++ {
		res := sendAfterReload(t, c, p.url("/l"), limitKey)
		if expectCode(t, res, 200, fmt.Sprintf("events 10 after 3 spent: #%d", i+1)) {
			expectRemaining(t, res, 10, 6-i, fmt.Sprintf("events 10 after 3 spent: #%d", i+1))
		}
	}
	res := sendAfterReload(t, c, p.url("/l"), limitKey)
	if expectCode(t, res, 429, "events 10 after 10 spent") {
		expectRemaining(t, res, 10, 0, "events 10 after 10 spent")
	}
	last := measure("after the limit change")
	for _, id := range first.ids {
		if !slices.Contains(last.ids, id) {
			t.Errorf("after the limit change: connection id=%d of the pool is gone (now %v)", id, last.ids)
		}
	}

	for _, s := range samples {
		t.Logf("%-24s connected_clients (without the asking one) %d; CLIENT LIST ids %v", s.phase+":", s.connected, s.ids)
	}
}
