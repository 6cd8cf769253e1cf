package fleet_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// BenchmarkTimeoutSweep measures how often the store's default decision timeout
// trips on a healthy local Redis, by concurrency: 3 Caddy processes
// sharing one Redis (standalone, then a 3-master Cluster), a zone that never
// refuses (so every 200 without X-RateLimit-* headers is a decision that
// timed out and failed open), bursts of N concurrent requests released
// together, spread evenly over the processes. For each N, fresh processes:
// the first burst is "cold" (empty connection pools, script not loaded),
// the next warmBursts are "warm".
//
// It is a measurement for choosing the default, slow-ish (about 20 s), so it
// is a benchmark: go test -run XXX -bench TimeoutSweep -benchtime 1x
// ./caddytest/fleet/ (SLUICE_FLEET_SWEEP_TIMEOUT=50ms sets the timeout to
// measure). It fails on any request not answered 200, and logs the table.
func BenchmarkTimeoutSweep(t *testing.B) {
	levels := []int{3, 6, 15, 30, 60, 120}
	const warmBursts = 10
	timeout := os.Getenv("SLUICE_FLEET_SWEEP_TIMEOUT") // e.g. 50ms; default: the store's default
	t.Run("standalone", func(t *testing.B) {
		r := redistest.Start(t)
		sweep(t, "store redis "+r.URL()+timeoutBlock(timeout), levels, warmBursts)
	})
	t.Run("cluster", func(t *testing.B) {
		c := redistest.StartCluster(t, 3)
		store := "store redis {\n\tcluster " + strings.Join(c.Addrs(), " ") + "\n"
		if timeout != "" {
			store += "\ttimeout " + timeout + "\n"
		}
		sweep(t, store+"}", levels, warmBursts)
	})
}

func timeoutBlock(timeout string) string {
	if timeout == "" {
		return ""
	}
	return " {\n\ttimeout " + timeout + "\n}"
}

func sweep(t testing.TB, store string, levels []int, warmBursts int) {
	for li, n := range levels {
		zone := fmt.Sprintf("sweep_%d", li)
		routes := fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		events 1000000
		window 1h
	}
	%s
}
respond "ok"`, zone, strings.ReplaceAll(store, "\n", "\n\t"))
		procs := make([]*caddyProc, exactProcs)
		for i := range procs {
			procs[i] = startCaddy(t, fmt.Sprintf("%s-%d", zone, i), "", routes)
		}
		client := newClient(n)
		var coldUndecided, warmUndecided, warmTotal int
		var coldDurs, warmDurs []time.Duration
		for b := 0; b <= warmBursts; b++ {
			rs := burst(t, client, procs, "/", n, fmt.Sprintf("%s-%s-%d", zone, nonce, b))
			und := 0
			for _, r := range rs {
				if r.err != nil || r.code != http.StatusOK {
					t.Errorf("N=%d burst %d: %s", n, b, r)
					continue
				}
				if !r.decided() {
					und++
				}
			}
			if b == 0 {
				coldUndecided = und
				for _, r := range rs {
					coldDurs = append(coldDurs, r.dur)
				}
			} else {
				warmUndecided += und
				warmTotal += len(rs)
				for _, r := range rs {
					warmDurs = append(warmDurs, r.dur)
				}
			}
		}
		client.CloseIdleConnections()
		for _, p := range procs {
			p.stop()
		}
		t.Logf("N=%3d: cold burst %3d/%3d failed open (p50 %v, max %v); warm %3d/%4d failed open (%.1f%%; p50 %v, p99 %v, max %v)",
			n, coldUndecided, n, percentile(coldDurs, 50).Round(time.Millisecond), percentile(coldDurs, 100).Round(time.Millisecond),
			warmUndecided, warmTotal, 100*float64(warmUndecided)/float64(max(warmTotal, 1)),
			percentile(warmDurs, 50).Round(time.Millisecond), percentile(warmDurs, 99).Round(time.Millisecond), percentile(warmDurs, 100).Round(time.Millisecond))
	}
}

// burst sends n concurrent GET path requests for user (and the further
// headers), request i to process i%len(procs), released together.
func burst(t testing.TB, client *http.Client, procs []*caddyProc, path string, n int, user string, headers ...string) []result {
	t.Helper()
	out := make([]result, n)
	var ready, wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		req, err := newGet(procs[i%len(procs)].url(path), append([]string{"X-User: " + user}, headers...)...)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			ready.Done()
			<-start
			out[i] = sendReq(client, req)
		}()
	}
	ready.Wait()
	close(start)
	wg.Wait()
	return out
}
