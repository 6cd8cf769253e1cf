package simulate_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/caddy-sluice/simulate"
)

// TestSettleZones: a settle zone in a replay charges what the traffic says
// each response reported: a CSV's settled column (a json source: the
// replaced upstream answers the amount at the path), an access log's
// recorded usage header (a header source). 1,000 tokens an hour, an
// estimate of 100, 300 tokens each: 4 of 10 pass, as in production.
func TestSettleZones(t *testing.T) {
	const site = `{
	admin off
}
:8080 {
	rate_limit {
		zone tokens {
			key {http.request.header.X-Api-Key}
			events 1000
			window 1h
			cost 100
			settle %s
		}
	}
	reverse_proxy localhost:9
}`
	dir := t.TempDir()
	run := func(source, traffic string) [2]int64 {
		t.Helper()
		p := filepath.Join(dir, "traffic")
		if err := os.WriteFile(p, []byte(traffic), 0o644); err != nil {
			t.Fatal(err)
		}
		rep, err := simulate.Run(simulate.Options{Config: adapt(t, fmt.Sprintf(site, source)), Traffic: p})
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range rep.Zones {
			if z.Name == "tokens" {
				return [2]int64{z.Allowed, z.Refused}
			}
		}
		t.Fatal("no zone tokens in the report")
		return [2]int64{}
	}

	var csv strings.Builder
	csv.WriteString("time,key,path,cost,settled\n")
	for i := range 10 {
		fmt.Fprintf(&csv, "%d,k1,/v1/chat/completions,,300\n", 1_700_000_000+i)
	}
	if got := run("json usage.total_tokens", csv.String()); got != [2]int64{4, 6} {
		t.Errorf("CSV settled column: allowed/refused %v, want [4 6]", got)
	}
	// Without the column, each request keeps its estimate: 10 pass.
	if got := run("json usage.total_tokens", strings.ReplaceAll(strings.ReplaceAll(csv.String(), ",300\n", "\n"), ",settled", "")); got != [2]int64{10, 0} {
		t.Errorf("CSV without settled: allowed/refused %v, want [10 0]", got)
	}

	var log strings.Builder
	for i := range 10 {
		l := accessLine(1.7e9+float64(i), "192.0.2.7", "POST", "/v1/chat/completions", "k1")
		log.WriteString(strings.Replace(l, `"resp_headers":{"Server":["Caddy"]}`, `"resp_headers":{"Server":["Caddy"],"X-Usage-Tokens":["300"]}`, 1) + "\n")
	}
	if got := run("header X-Usage-Tokens", log.String()); got != [2]int64{4, 6} {
		t.Errorf("access log with the usage header: allowed/refused %v, want [4 6]", got)
	}
}
