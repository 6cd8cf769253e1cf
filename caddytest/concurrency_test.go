package caddytest_test

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
)

// TestConcurrentExact: 50 requests with one key, released together through
// real HTTP against events 20 per hour, admit exactly 20 and refuse exactly
// 30; repeated with fresh keys to catch a race.
func TestConcurrentExact(t *testing.T) {
	const (
		workers  = 50
		capacity = 20
		rounds   = 20
	)
	tc := newTester(t)
	z := zoneName("concurrent")
	cfg := config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 20
			window 1h
		}
	}
	respond "ok"
}
`, "ZONE", z)
	load(t, tc, cfg)

	client := loopbackClient(workers)
	defer client.CloseIdleConnections()

	type outcome struct {
		code      int
		remaining string
		err       error
	}
	for round := 0; round < rounds; round++ {
		user := "u-" + nonce + "-" + strconv.Itoa(round)
		start := make(chan struct{})
		out := make([]outcome, workers)
		var wg sync.WaitGroup
		for i := 0; i < workers; i++ {
			req, err := http.NewRequest(http.MethodGet, siteA+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-User", user)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				resp, err := doRetry(t, client, req)
				if err != nil {
					out[i].err = err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				out[i] = outcome{code: resp.StatusCode, remaining: resp.Header.Get("X-Ratelimit-Remaining")}
			}()
		}
		close(start)
		wg.Wait()

		var ok, refused, other int
		var remaining []int
		for _, o := range out {
			switch {
			case o.err != nil:
				t.Errorf("round %d: request failed: %v", round, o.err)
				other++
			case o.code == 200:
				ok++
				n, err := strconv.Atoi(o.remaining)
				if err != nil {
					t.Errorf("round %d: X-RateLimit-Remaining %q on a 200", round, o.remaining)
				}
				remaining = append(remaining, n)
			case o.code == 429:
				refused++
				if o.remaining != "0" {
					t.Errorf("round %d: X-RateLimit-Remaining %q on a 429, want 0", round, o.remaining)
				}
			default:
				t.Errorf("round %d: status %d", round, o.code)
				other++
			}
		}
		if ok != capacity || refused != workers-capacity {
			t.Errorf("round %d: %d allowed, %d refused, %d other; want exactly %d allowed and %d refused",
				round, ok, refused, other, capacity, workers-capacity)
		}
		// Each admitted request saw its own step of the countdown.
		slices.Sort(remaining)
		want := make([]int, 0, capacity)
		for i := 0; i < capacity; i++ {
			want = append(want, i)
		}
		if ok == capacity && !slices.Equal(remaining, want) {
			t.Errorf("round %d: X-RateLimit-Remaining of the admitted requests %v, want each of 0..19 once", round, remaining)
		}
		if t.Failed() {
			return
		}
	}
}
