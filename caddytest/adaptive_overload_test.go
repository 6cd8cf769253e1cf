package caddytest_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestAdaptiveOverload: the testbed's overload through real Caddy. An
// upstream of 4 workers taking 50 ms each (capacity 80 requests a second,
// a FIFO queue beyond them) behind an adaptive zone with the default
// controller; an open-loop load (a request every 1/rate, whatever the
// answers) at 0.5× capacity for 2 s, then 3× for 6 s. Checked with margins
// for a shared 2-core machine, as ratios of what the same run measured:
// nothing refused below capacity; under overload, in its last 4 s, goodput
// (answers within the client's 1 s) at least 70% of capacity and the
// admitted requests' p99 at most 5× the unloaded p99; the limit learnt
// within 2..16 (the knee is 4). Without the zone the queue would grow by
// 160 requests a second and every answer would come after the client's
// timeout within a few seconds (docs/adaptive.md, the testbed).
func TestAdaptiveOverload(t *testing.T) {
	const (
		workers  = 4
		service  = 50 * time.Millisecond
		capacity = float64(workers) / 0.05 // per second
		timeout  = time.Second
	)
	slots := make(chan struct{}, workers)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		time.Sleep(service)
		<-slots
		_, _ = w.Write([]byte("done"))
	}))
	defer up.Close()
	tc := newTester(t)
	zone := zoneName("adaptive_overload")
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key static
			concurrent adaptive
		}
	}
	reverse_proxy @UP@
}
`, "ZONE", zone, "UP", up.Listener.Addr().String()))
	tr := &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 0}
	client := &http.Client{Transport: tr, Timeout: timeout}
	defer tr.CloseIdleConnections()

	type outcome struct {
		code int
		took time.Duration
		at   time.Duration // since the phase began
	}
	// run sends rate requests a second for d and returns their outcomes.
	run := func(rate float64, d time.Duration) []outcome {
		var mu sync.Mutex
		var out []outcome
		var wg sync.WaitGroup
		start := time.Now()
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for time.Since(start) < d {
			<-tick.C
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent := time.Now()
				o := outcome{at: sent.Sub(start)}
				resp, err := client.Get(siteA + "/")
				if err == nil {
					o.code = resp.StatusCode
					resp.Body.Close()
				}
				o.took = time.Since(sent)
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return out
	}
	p99 := func(os []outcome, from time.Duration) (time.Duration, int, int) {
		var lat []time.Duration
		refused := 0
		for _, o := range os {
			if o.at < from {
				continue
			}
			switch o.code {
			case http.StatusOK:
				lat = append(lat, o.took)
			case http.StatusTooManyRequests:
				refused++
			}
		}
		if len(lat) == 0 {
			return 0, 0, refused
		}
		slices.Sort(lat)
		return lat[len(lat)*99/100], len(lat), refused
	}

	calm := run(capacity/2, 2*time.Second)
	unloaded, _, refusedCalm := p99(calm, 0)
	if refusedCalm > 0 {
		t.Errorf("at 0.5x capacity: %d of %d refused, want none", refusedCalm, len(calm))
	}
	over := run(3*capacity, 6*time.Second)
	good := 0
	for _, o := range over {
		if o.at >= 2*time.Second && o.code == http.StatusOK && o.took <= timeout {
			good++
		}
	}
	loaded, admitted, refused := p99(over, 2*time.Second)
	limit := jsonInt(t, adaptiveListing(t, zone), "limit")
	t.Logf("unloaded p99 %v; at 3x, last 4 s: goodput %.0f/s of %.0f, admitted %d (p99 %v), refused %d; limit %d",
		unloaded, float64(good)/4, capacity, admitted, loaded, refused, limit)
	if g := float64(good) / 4; g < 0.7*capacity {
		t.Errorf("at 3x: goodput %.0f/s, want at least 70%% of the capacity %.0f", g, capacity)
	}
	if loaded > 5*unloaded {
		t.Errorf("at 3x: admitted p99 %v, want at most 5x the unloaded %v", loaded, unloaded)
	}
	if limit < 2 || limit > 16 {
		t.Errorf("the limit learnt under overload: %d, want within 2..16 (the knee is %d)", limit, workers)
	}
}
