package caddytest_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// settleCaseSite is a settle zone (events 1000, cost 100) in front of an
// upstream that answers /case/<name> as the test says and /probe with
// nothing to settle.
const settleCaseSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Key}
			events 1000
			window 1h
			cost 100
			settle @SOURCE@
		}
	}
	reverse_proxy @APP@ {
		flush_interval -1
	}
}`

// settleCase is a response an upstream gives and what the zone must keep
// of it: the amount it reports, or the estimate (100).
type settleCase struct {
	name  string
	serve func(w http.ResponseWriter)
	spent int64
}

func jsonBody(body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, body)
	}
}

func events(body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, body)
	}
}

// gzipJSON compresses body whatever the request accepted (an upstream
// that ignores Accept-Encoding: identity).
func gzipJSON(body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, body)
		zw.Close()
	}
}

func usageHeader(name, value string, trailer bool) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if trailer {
			w.Header().Set("Trailer", name)
			io.WriteString(w, "hello")
		}
		w.Header().Set(name, value)
		if !trailer {
			io.WriteString(w, "hello")
		}
	}
}

// runSettleCases loads the site with source, and for each case sends one
// request with a key of its own and then a probe: the probe's remaining
// shows what the case's response left charged.
func runSettleCases(t *testing.T, source string, cases []settleCase) {
	t.Helper()
	byName := map[string]func(http.ResponseWriter){}
	for _, c := range cases {
		byName[c.name] = c.serve
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if serve := byName[strings.TrimPrefix(r.URL.Path, "/case/")]; serve != nil {
			serve(w)
		}
	}))
	t.Cleanup(up.Close)
	load(t, newTester(t), config("", settleCaseSite, "ZONE", zoneName("settle_input"), "APP", up.Listener.Addr().String(), "SOURCE", source))
	c := loopbackClient(8)
	for _, sc := range cases {
		key := "X-Key: " + sc.name + nonce
		expect(t, get(t, c, siteA+"/case/"+sc.name, key), http.StatusOK, sc.name)
		probe := get(t, c, siteA+"/probe", key)
		expectLimitHeaders(t, probe, 1000, 1000-sc.spent-100, sc.name+": the probe after it")
	}
}

// Bad input: a non-numeric, negative, huge (> 2^53) or missing amount, a
// body that is not JSON, an event stream cut mid-event, a body compressed
// though the upstream was asked for it as is: the zone's unknown rule
// charges it (here 150; or what was read of the stream settles); a usable
// amount settles.
func TestSettleBadInput(t *testing.T) {
	t.Run("json", func(t *testing.T) {
		runSettleCases(t, "json usage.total_tokens {\n\t\t\t\tunknown 150\n\t\t\t}", []settleCase{
			{"ok", jsonBody(`{"usage":{"total_tokens":300}}`), 300},
			{"less", jsonBody(`{"usage":{"total_tokens":30}}`), 30},
			{"string", jsonBody(`{"usage":{"total_tokens":"300"}}`), 150},
			{"negative", jsonBody(`{"usage":{"total_tokens":-300}}`), 150},
			{"huge", jsonBody(`{"usage":{"total_tokens":9007199254740993}}`), 150},
			{"missing", jsonBody(`{"usage":{}}`), 150},
			{"not_json", jsonBody(`<html>{"usage":{"total_tokens":300}}</html>`), 150},
			{"events", events("data: {\"usage\":{\"total_tokens\":250}}\n\ndata: [DONE]\n\n"), 250},
			{"events_cut", events("data: {\"usage\":{\"total_tokens\":250}}\n\ndata: {\"usage\":{\"total_tokens\":999}}"), 250},
			{"events_cut_first", events("data: {\"usage\":{\"total_tokens\":999}}"), 150},
			{"gzip_anyway", gzipJSON(`{"usage":{"total_tokens":300}}`), 150},
		})
	})
	t.Run("header", func(t *testing.T) {
		runSettleCases(t, "header X-Usage {\n\t\t\t\tunknown 150\n\t\t\t}", []settleCase{
			{"ok", usageHeader("X-Usage", "300", false), 300},
			{"trailer", usageHeader("X-Usage", "280", true), 280},
			{"zero", usageHeader("X-Usage", "0", false), 0},
			{"string", usageHeader("X-Usage", "lots", false), 150},
			{"negative", usageHeader("X-Usage", "-3", false), 150},
			{"huge", usageHeader("X-Usage", "9007199254740993", false), 150},
			{"missing", jsonBody(`{}`), 150},
		})
	})
}

// A client that goes away mid-stream: what was read settles (an event
// carrying 250 tokens, sent before the client left), the charge is not
// left in flight.
func TestSettleClientGoneMidStream(t *testing.T) {
	sent := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/case/stream" {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"usage\":{\"total_tokens\":250}}\n\n")
		w.(http.Flusher).Flush()
		close(sent)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	t.Cleanup(up.Close)
	zone := zoneName("settle_gone")
	load(t, newTester(t), config("", settleCaseSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "SOURCE", "json usage.total_tokens"))
	c := loopbackClient(8)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, siteA+"/case/stream", nil)
	req.Header.Set("X-Key", "gone"+nonce)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, "250") {
		t.Fatalf("first event: %q %v", line, err)
	}
	<-sent
	cancel()
	resp.Body.Close()
	// The handler ends once Caddy sees the client gone; the key then shows
	// 250 settled (the admin API reads it without charging).
	path := "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape("gone"+nonce)
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := adminAPI(t, "GET", path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %v", path, code, body)
		}
		rem, _ := body["remaining"].(float64)
		if rem == 1000-250 {
			break
		}
		if rem != 1000-100 || time.Now().After(deadline) {
			t.Fatalf("the key's remaining is %v, want %d (250 settled; 900 while in flight)", rem, 1000-250)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
