package caddytest_test

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkSettleStream measures what settle adds to a streamed response
// (figures: docs/performance.md): a stand-in upstream sends 8 events 2ms
// apart, each stamped with the instant it was written, through Caddy's
// reverse_proxy; the client reads them. It reports the time to the first
// event (ns/first-event) and the mean delay of an event from its write
// upstream to its read by the client (ns/event), without a settle zone and
// with one reading the events (settle json) or a JSON body.
//
//	go test -run '^$' -bench BenchmarkSettleStream -benchtime 200x ./caddytest/
func BenchmarkSettleStream(b *testing.B) {
	const events = 8
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/json" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"sent":%d,"usage":{"total_tokens":3}}`, time.Now().UnixNano())
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := range events {
			if i > 0 {
				time.Sleep(2 * time.Millisecond)
			}
			fmt.Fprintf(w, "data: {\"sent\":%d,\"usage\":{\"total_tokens\":%d}}\n\n", time.Now().UnixNano(), i)
			f.Flush()
		}
	}))
	defer up.Close()
	for _, mode := range []struct{ name, zone string }{
		{"off", ""},
		{"settle", "settle json usage.total_tokens"},
	} {
		site := `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key static
			events 1000000000
			window 1h
			@SETTLE@
		}
	}
	reverse_proxy @APP@ {
		flush_interval -1
	}
}`
		cfg := config("", site, "ZONE", zoneName("bench_settle"), "APP", up.Listener.Addr().String(), "SETTLE", mode.zone)
		resp, err := http.Post(adminURL+"/load", "text/caddyfile", strings.NewReader(cfg))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("loading the config: %s", resp.Status)
		}
		c := loopbackClient(1)
		for _, path := range []string{"/events", "/json"} {
			b.Run(mode.name+path, func(b *testing.B) {
				var first, delay time.Duration
				var n int
				for range b.N {
					start := time.Now()
					resp, err := c.Get(siteA + path)
					if err != nil {
						b.Fatal(err)
					}
					br := bufio.NewReader(resp.Body)
					got := 0
					for {
						line, err := br.ReadString('\n')
						now := time.Now()
						if i := strings.Index(line, `"sent":`); i >= 0 {
							sent, _ := strconv.ParseInt(line[i+7:i+7+strings.IndexByte(line[i+7:], ',')], 10, 64)
							if got == 0 {
								first += now.Sub(start)
							}
							delay += now.Sub(time.Unix(0, sent))
							got++
							n++
						}
						if err != nil {
							break
						}
					}
					resp.Body.Close()
					if got == 0 {
						b.Fatalf("%s: no event read", path)
					}
				}
				b.ReportMetric(float64(first.Nanoseconds())/float64(b.N), "ns/first-event")
				b.ReportMetric(float64(delay.Nanoseconds())/float64(n), "ns/event")
			})
		}
	}
}
