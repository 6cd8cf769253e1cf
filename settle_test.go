package sluice

import "testing"

// TestSettleConfigChecks: a settle source is checked at load, the error
// naming the zone and the field: one source, a path of keys, a rate zone
// of its own (not with count, local_allowance or concurrent), a store
// that can settle.
func TestSettleConfigChecks(t *testing.T) {
	zone := func(extra string) string {
		return site("", "\t\tzone t {\n\t\t\tevents 1000\n\t\t\twindow 1m\n"+extra+"\t\t}")
	}
	for _, c := range []struct {
		name, caddyfile string
		want            []string // nil: loads
	}{
		{"json", zone("\t\t\tsettle json usage.total_tokens\n"), nil},
		{"header", zone("\t\t\tsettle header X-Usage-Tokens\n"), nil},
		{"no source", zone("\t\t\tsettle\n"), []string{"settle", "header <name> or json <path>"}},
		{"unknown source", zone("\t\t\tsettle body usage\n"), []string{"settle", `"body usage"`}},
		{"empty segment", zone("\t\t\tsettle json usage..total\n"), []string{`zone "t"`, "settle", "empty segment"}},
		{"bad header", zone("\t\t\tsettle header \"X Usage\"\n"), []string{`zone "t"`, "settle", "not a header name"}},
		{"with count", zone("\t\t\tsettle json n\n\t\t\tcount 2xx\n"), []string{`zone "t"`, "settle", "not with count"}},
		{"with local_allowance", zone("\t\t\tsettle json n\n\t\t\tlocal_allowance\n"), []string{`zone "t"`, "settle", "local_allowance"}},
		{"concurrency zone", site("", "\t\tzone t {\n\t\t\tconcurrent 3\n\t\t\tsettle json n\n\t\t}"), []string{`zone "t"`, "settle", "concurrency zone"}},
	} {
		t.Run(c.name, func(t *testing.T) { expectConfig(t, c.caddyfile, c.want) })
	}
}
