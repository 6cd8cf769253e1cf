package caddytest_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestReloadUnderLoad: config reloads through /load while requests flow
// lose no request (every request that reaches Caddy is answered 200, no
// error on an established connection), keep the counters of unchanged
// zones, and a bad config is refused while the old one keeps enforcing.
//
// One failure is not Sluice's and is retried rather than counted: a dial
// answered with a reset. Caddy on Linux binds each config's listener with
// SO_REUSEPORT and closes the old one after the new one is up; a connect
// the kernel was still completing on the old socket is answered with a
// reset when that socket closes (unless the host sets
// net.ipv4.tcp_migrate_req). Such a connection never reached a handler. The
// test retries it (as a client does with a failed connect) and reports how
// many there were; any other error, or a status other than 200, fails it.
func TestReloadUnderLoad(t *testing.T) {
	tc := newTester(t)
	flow, counted := zoneName("underload_flow"), zoneName("underload_count")
	cfg := func(body string) string {
		return config("", `http://localhost:@A@ {
	rate_limit {
		zone @FLOW@ {
			key {http.request.header.X-Worker}
			events 1000000
			window 1h
		}
		zone @COUNT@ {
			match {
				path /counted
			}
			key {http.request.header.X-User}
			events 3
			window 1h
		}
	}
	respond "@BODY@"
}
`, "FLOW", flow, "COUNT", counted, "BODY", body)
	}
	load(t, tc, cfg("v0"))
	for i := 0; i < 2; i++ {
		expect(t, get(t, tc.Client, siteA+"/counted", "X-User: u"), 200, "spend before the reloads")
	}

	// A plain client, no retries of ours: what a real client would see.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	defer client.CloseIdleConnections()
	var sent, failed, dialResets atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const workers, maxPerWorker = 4, 20000 // bounded; stopped after the reloads
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < maxPerWorker; i++ {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, siteA+"/", nil)
				req.Header.Set("X-Worker", fmt.Sprint(w))
				sent.Add(1)
				resp, err := client.Do(req)
				for retry := 0; err != nil && isDialReset(err) && retry < 3; retry++ {
					dialResets.Add(1)
					resp, err = client.Do(req)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("status %d", resp.StatusCode))
				}
			}
		}(w)
	}
	for i := 1; i <= 5; i++ {
		time.Sleep(150 * time.Millisecond)
		if code, msg := postLoad(t, cfg(fmt.Sprintf("v%d", i)), "text/caddyfile"); code != http.StatusOK {
			t.Errorf("reload %d: %d %s", i, code, msg)
		}
	}
	time.Sleep(150 * time.Millisecond)
	bad := config("", `http://localhost:@A@ {
	rate_limit {
		zone @COUNT@ {
			key {http.request.header.X-User}
			events 0
			window 1h
		}
	}
	respond "bad"
}
`, "COUNT", counted)
	expectLoadRefused(t, bad, "text/caddyfile", counted, "events")
	time.Sleep(150 * time.Millisecond)
	close(stop)
	wg.Wait()

	if sent.Load() < 100 {
		t.Fatalf("only %d requests were sent during the reloads", sent.Load())
	}
	if f := failed.Load(); f != 0 {
		t.Fatalf("%d of %d requests failed during 5 reloads (first: %v)", f, sent.Load(), firstErr.Load())
	}
	t.Logf("%d requests, 0 failed, across 5 reloads and a refused config (%d connects reset by the closing listener, retried)", sent.Load(), dialResets.Load())
	// The counted zone kept its counter (2 of 3 spent) through everything.
	r := expect(t, get(t, tc.Client, siteA+"/counted", "X-User: u"), 200, "the third")
	if r.body != "v5" {
		t.Fatalf("the last good config is not serving: body %q", r.body)
	}
	expect(t, get(t, tc.Client, siteA+"/counted", "X-User: u"), 429, "the fourth")
}

// isDialReset reports whether err is a connect answered with a reset: the
// kernel dropping a connection queued on a listener Caddy closed at reload,
// before any handler saw it.
func isDialReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" && errors.Is(err, syscall.ECONNRESET)
}
