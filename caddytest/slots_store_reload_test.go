package caddytest_test

import (
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestSlotsAcrossStoreChange (issue 23, item 10): three slots held under
// `concurrent 3`, then a reload that changes the store's settings (a new
// memory store; a new Redis client on the same server): the held slots
// still count. Six requests sent at once after the reload are all refused
// while the three are held (the upstream never sees more than three, nor
// does the gauge); once they end, exactly three get in again.
func TestSlotsAcrossStoreChange(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		slotsAcrossStoreChange(t, "", "store memory {\n\t\t\tmax_keys 5000\n\t\t}")
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		slotsAcrossStoreChange(t, "store redis "+srv.URL()+" {\n\t\t\ttimeout 2s\n\t\t}",
			"store redis "+srv.URL()+" {\n\t\t\ttimeout 3s\n\t\t\tpool_size 7\n\t\t}")
	})
}

func slotsAcrossStoreChange(t *testing.T, before, after string) {
	tc := newTester(t)
	up := newHoldUpstream(t)
	zone := zoneName("slots_store")
	site := func(store string) string {
		return config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent 3
		}
		@STORE@
	}
	reverse_proxy @UP@
}
`, "ZONE", zone, "UP", up.addr(), "STORE", store)
	}
	load(t, tc, site(before))
	client := loopbackClient(16)
	defer client.CloseIdleConnections()
	user := "s-" + nonce
	hdr := "X-User: " + user
	// send sends n requests at once and reports their statuses (0: no
	// answer) on the channel returned.
	send := func(n int, path string) <-chan int {
		codes := make(chan int, n)
		for range n {
			go func() {
				req, _ := http.NewRequest(http.MethodGet, siteA+path, nil)
				req.Header.Set("X-User", user)
				resp, err := client.Do(req)
				if err != nil {
					codes <- 0
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes <- resp.StatusCode
			}()
		}
		return codes
	}
	collect := func(codes <-chan int, n int, what string) map[int]int {
		t.Helper()
		got := map[int]int{}
		for i := range n {
			select {
			case c := <-codes:
				got[c]++
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: only %d of %d answered (%v); the others were admitted and are held", what, i, n, got)
			}
		}
		return got
	}

	up.hold()
	old := send(3, "/hold")
	up.waitArrived(t, 3)
	expect(t, get(t, client, siteA+"/ok", hdr), 429, "a fourth request under concurrent 3")

	load(t, tc, site(after))
	if got := collect(send(6, "/hold"), 6, "six at once after the reload"); got[429] != 6 {
		t.Errorf("six at once after the reload, three slots held: %v, want 6 × 429", got)
	}
	if n, p := up.inFlight.Load(), up.peak.Load(); n != 3 || p != 3 {
		t.Errorf("upstream: %d in flight, peak %d; want 3 and 3", n, p)
	}
	if g := slotsGauge(t, zone); g != 3 {
		t.Errorf("caddy_rate_limit_concurrent_slots %v, want 3", g)
	}
	if got := inUse(t, zone, user); got != 3 {
		t.Errorf("in_use %d after the reload, want 3", got)
	}

	// The old requests end: their slots go back to the store that now
	// counts them.
	up.releaseAll()
	if got := collect(old, 3, "the requests of the old config"); got[200] != 3 {
		t.Fatalf("the requests of the old config: %v, want 3 × 200", got)
	}
	waitInUse(t, zone, user, 0, 5*time.Second)
	up.hold()
	held := send(3, "/hold")
	up.waitArrived(t, 3)
	if got := collect(send(3, "/hold"), 3, "three more"); got[429] != 3 {
		t.Errorf("three more with three held: %v, want 3 × 429", got)
	}
	if p := up.peak.Load(); p != 3 {
		t.Errorf("upstream peak %d, want 3", p)
	}
	up.releaseAll()
	if got := collect(held, 3, "the held requests"); got[200] != 3 {
		t.Fatalf("the held requests: %v, want 3 × 200", got)
	}
	waitInUse(t, zone, user, 0, 5*time.Second)
	if g := slotsGauge(t, zone); g != 0 {
		t.Errorf("caddy_rate_limit_concurrent_slots %v after every request ended, want 0", g)
	}
	t.Logf("slots across a store change (%s): held 3, 6 refused after the reload, 3 again after they ended", strconv.Quote(after))
}
