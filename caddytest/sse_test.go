package caddytest_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestSSEHoldsSlot: server-sent events behind reverse_proxy: a
// concurrency zone (concurrent 1 per user) holds the slot for the stream's
// life and frees it when the stream ends, whether the server ends it or
// the client leaves; a count zone counting only 200 keeps the streams'
// charges (their status, 200, known once they end) and gives back the
// route's 204s.
func TestSSEHoldsSlot(t *testing.T) {
	end := make(chan struct{}, 1)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/nothing" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: hello\n\n"))
		w.(http.Flusher).Flush()
		select {
		case <-end:
		case <-r.Context().Done():
		}
	}))
	defer app.Close()
	zc, zn := zoneName("sse_conc"), zoneName("sse_count")
	load(t, newTester(t), config("", `http://localhost:@A@ {
	rate_limit {
		zone @ZC@ {
			key {http.request.header.X-User}
			concurrent 1
			match {
				header X-Zone conc
			}
		}
		zone @ZN@ {
			key {http.request.header.X-User}
			events 2
			window 1h
			count 200
			match {
				header X-Zone count
			}
		}
	}
	reverse_proxy @APP@ {
		flush_interval -1
	}
}
`, "ZC", zc, "ZN", zn, "APP", app.Listener.Addr().String()))
	c := loopbackClient(4)
	defer c.CloseIdleConnections()

	// open starts a stream and reads its first event; the status when
	// refused.
	open := func(ctx context.Context, user, zone, path string) (*http.Response, int) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, siteA+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-User", user)
		req.Header.Set("X-Zone", zone)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, resp.StatusCode
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "data: hello") {
			t.Fatalf("first event: %q %v", line, err)
		}
		return resp, 200
	}
	admitted := func(user string, what string) *http.Response {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for {
			resp, code := open(context.Background(), user, "conc", "/events")
			if code == 200 {
				return resp
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still %d after 3s", what, code)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	user := "sse-" + nonce
	ctx, cancel := context.WithCancel(context.Background())
	first, _ := open(ctx, user, "conc", "/events")
	if _, code := open(context.Background(), user, "conc", "/events"); code != http.StatusTooManyRequests {
		t.Errorf("a second stream while one is open: %d, want 429", code)
	}
	// The client leaves.
	cancel()
	first.Body.Close()
	second := admitted(user, "after the client left")
	if _, code := open(context.Background(), user, "conc", "/events"); code != http.StatusTooManyRequests {
		t.Errorf("a second stream while the new one is open: %d, want 429", code)
	}
	// The server ends the stream.
	end <- struct{}{}
	// The stream's end reaches the client: the slot was free by then.
	if _, err := io.Copy(io.Discard, second.Body); err != nil {
		t.Fatalf("the stream the server ended: %v", err)
	}
	second.Body.Close()
	third := admitted(user, "after the server ended the stream")
	end <- struct{}{}
	third.Body.Close()

	// count 200: two streams (200, once they end) spend the 2 events,
	// 204s are given back.
	user = "ssec-" + nonce
	for range 3 {
		if _, code := open(context.Background(), user, "count", "/nothing"); code != http.StatusNoContent {
			t.Fatalf("/nothing: %d, want 204", code)
		}
	}
	for i := range 2 {
		resp, code := open(context.Background(), user, "count", "/events")
		if code != 200 {
			t.Fatalf("count zone, stream %d: %d", i+1, code)
		}
		end <- struct{}{}
		resp.Body.Close()
	}
	time.Sleep(100 * time.Millisecond) // the streams' ends reach Caddy
	if _, code := open(context.Background(), user, "count", "/events"); code != http.StatusTooManyRequests {
		t.Errorf("count zone, a third stream after two ended with 200 and three 204s: %d, want 429", code)
	}
}
