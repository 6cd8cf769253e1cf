package sluice

import (
	"fmt"
	"strings"
	"testing"
)

// TestSettleRequestRulesNameTheLine (issue 34, items 2 and 4): a cost or a
// settle's unknown charge whose placeholder can never be a whole number,
// and the settle block's request options written wrong, are refused at
// adapt time naming the zone, the field and the line (marked #here).
func TestSettleRequestRulesNameTheLine(t *testing.T) {
	rate := func(extra string) string {
		return site("", "\t\tzone z1 {\n\t\t\tevents 5000\n\t\t\twindow 1m\n"+extra+"\n\t\t}")
	}
	settle := func(src, opts string) string {
		return rate("\t\t\tsettle " + src + " { #here\n" + opts + "\n\t\t\t}")
	}
	cases := []struct {
		name, caddyfile string
		want            []string
	}{
		{"cost from the host", rate("\t\t\tcost {http.request.host} #here"), []string{"cost", "can never be a whole number", "{http.request.host}"}},
		{"cost from the client address", rate("\t\t\tcost {http.vars.client_ip} 5 #here"), []string{"cost", "can never be a whole number"}},
		{"cost with text", rate("\t\t\tcost tokens-{http.request.header.X-Cost} #here"), []string{"cost", `"tokens-"`, "not digits"}},
		{"cost from a refusal's placeholder", rate("\t\t\tcost {http.rate_limit.remaining} #here"), []string{"cost", "{http.rate_limit.remaining}"}},
		{"cost from a request field without a path", rate("\t\t\tcost {http.rate_limit.request_json.} #here"), []string{"cost", "dot path"}},
		{"unknown from the method", settle("json usage.total_tokens", "\t\t\t\tunknown {http.request.method} 10"), []string{"settle: unknown", "can never be a whole number"}},
		{"unknown from a path-less field", settle("json usage.total_tokens", "\t\t\t\tunknown {http.rate_limit.request_json..x} 10"), []string{"settle: unknown", "dot path"}},
		{"ask_usage on a header source", settle("header X-Usage", "\t\t\t\task_usage on"), []string{"settle: ask_usage applies to a json source"}},
		{"unknown negative", rate("\t\t\tsettle json usage.total_tokens {\n\t\t\t\tunknown -5 #here\n\t\t\t}"), []string{"settle: unknown must be at least 1"}},
		{"unknown words", rate("\t\t\tsettle json usage.total_tokens {\n\t\t\t\tunknown lots #here\n\t\t\t}"), []string{"settle: unknown must be an integer"}},
		{"unknown three", rate("\t\t\tsettle json usage.total_tokens {\n\t\t\t\tunknown {http.rate_limit.request_json.max_tokens} 1 2 #here\n\t\t\t}"), []string{"settle: unknown takes"}},
		{"ask_usage maybe", rate("\t\t\tsettle json usage.total_tokens {\n\t\t\t\task_usage maybe #here\n\t\t\t}"), []string{"settle: ask_usage is on or off"}},
		{"an unknown option", rate("\t\t\tsettle json usage.total_tokens {\n\t\t\t\task_politely #here\n\t\t\t}"), []string{`settle: unknown option "ask_politely"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			line := 1 + strings.Count(c.caddyfile[:strings.Index(c.caddyfile, "#here")], "\n")
			_, err := adapt(t, c.caddyfile)
			if err == nil {
				t.Fatalf("adapted without error, want the error at Caddyfile:%d:\n%s", line, c.caddyfile)
			}
			for _, w := range append(c.want, `zone "z1"`, fmt.Sprintf("Caddyfile:%d", line)) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// What can be a number loads.
	for _, ok := range []string{
		rate("\t\t\tcost {http.rate_limit.request_json.max_tokens} 1000"),
		rate("\t\t\tcost 1{http.request.header.X-Hundreds}"),
		rate("\t\t\tcost {http.request.header.X-Cost}\n\t\t\tsettle json usage.total_tokens {\n\t\t\t\tunknown {http.rate_limit.request_json.max_tokens} 1000\n\t\t\t\task_usage off\n\t\t\t}"),
		rate("\t\t\tsettle json usage.total_tokens"),
		rate("\t\t\tsettle header X-Usage {\n\t\t\t\tunknown 4000\n\t\t\t}"),
	} {
		if _, err := adapt(t, ok); err != nil {
			t.Errorf("refused: %v\n%s", err, ok)
		}
	}
}

// TestCostReadsRequestJSON (item 4): a cost placeholder reading the
// request's JSON makes the directive read request bodies for its path.
func TestCostReadsRequestJSON(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone z {
			events 5000
			window 1h
			cost {http.rate_limit.request_json.max_tokens} 1000
		}
	}`, nil)
	if p := h.requestJSON.paths; len(p) != 1 || p[0] != "max_tokens" {
		t.Fatalf("the directive reads request JSON paths %q, want [max_tokens]", p)
	}
}
