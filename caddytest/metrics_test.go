package caddytest_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// scrapeDecisions reads caddy_rate_limit_decisions_total for one zone from
// the admin endpoint's /metrics, by outcome.
func scrapeDecisions(t *testing.T, zone string) map[string]int {
	t.Helper()
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	prefix := "caddy_rate_limit_decisions_total{"
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) || !strings.Contains(line, `zone="`+zone+`"`) {
			continue
		}
		i := strings.Index(line, `outcome="`)
		rest := line[i+len(`outcome="`):]
		outcome := rest[:strings.IndexByte(rest, '"')]
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		out[outcome] = int(v)
	}
	return out
}

// TestMetricsCountDecisions: the decision counters in Caddy's metrics
// registry match the requests sent, by outcome, and keep counting across a
// config reload.
func TestMetricsCountDecisions(t *testing.T) {
	tc := newTester(t)
	zone := zoneName("metrics")
	cfg := func(body string) string {
		return config("", `http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 3
			window 1h
		}
	}
	respond "@BODY@"
}
`, "ZONE", zone, "BODY", body)
	}
	load(t, tc, cfg("one"))
	for i := 0; i < 5; i++ {
		get(t, tc.Client, siteA+"/", "X-User: "+zone)
	}
	if got := scrapeDecisions(t, zone); got["allowed"] != 3 || got["refused"] != 2 || got["failed_open"] != 0 {
		t.Fatalf("after 3 allowed and 2 refused: %v", got)
	}
	load(t, tc, cfg("two"))
	get(t, tc.Client, siteA+"/", "X-User: "+zone)
	get(t, tc.Client, siteA+"/", "X-User: other-"+zone)
	if got := scrapeDecisions(t, zone); got["allowed"] != 4 || got["refused"] != 3 {
		t.Fatalf("after a reload, 1 more allowed and 1 more refused: %v", got)
	}
}
