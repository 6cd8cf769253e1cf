package sluice

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// validateCaddyfile adapts a whole Caddyfile and provisions it the way
// `caddy validate` does (every module provisioned and validated, nothing
// started): the errors an operator sees before running it.
func validateCaddyfile(t *testing.T, caddyfile string) error {
	t.Helper()
	js, err := adapt(t, caddyfile)
	if err != nil {
		return err
	}
	var cfg caddy.Config
	if err := json.Unmarshal(js, &cfg); err != nil {
		t.Fatalf("adapted JSON: %v", err)
	}
	return caddy.Validate(&cfg)
}

// site wraps a rate_limit block (and global options) into a Caddyfile.
func site(global, block string) string {
	return "{\n\tadmin off\n" + global + "}\n:0 {\n\trate_limit {\n" + block + "\n\t}\n\trespond ok\n}\n"
}

const zoneZ = "\t\tzone z {\n\t\t\tevents 5\n\t\t\twindow 1m\n\t\t}\n"

// TestConfigChecks: bad values are refused before the config runs, with a
// message naming the field (issue 13, items 7-11); values caddy-ratelimit
// accepts load (items 12, 13, 15).
func TestConfigChecks(t *testing.T) {
	cases := []struct {
		name, caddyfile string
		want            []string // nil: loads
	}{
		// 7. A sweep that runs all the time.
		{"store sweep_interval 1ns", site("", zoneZ+"\t\tstore memory {\n\t\t\tsweep_interval 1ns\n\t\t}"), []string{"sweep_interval", "at least 1s", "1ns"}},
		{"store sweep_interval 999ms", site("", zoneZ+"\t\tstore memory {\n\t\t\tsweep_interval 999ms\n\t\t}"), []string{"sweep_interval", "at least 1s"}},
		{"store sweep_interval 1s", site("", zoneZ+"\t\tstore memory {\n\t\t\tsweep_interval 1s\n\t\t}"), nil},
		{"directive sweep_interval 1ns", site("", zoneZ+"\t\tsweep_interval 1ns"), []string{"sweep_interval", "at least 1s"}},
		{"global store sweep_interval 1us", site("\trate_limit {\n\t\tstore memory {\n\t\t\tsweep_interval 1us\n\t\t}\n\t}\n", zoneZ), []string{"sweep_interval", "at least 1s"}},
		// 8. NaN passes every range check.
		{"jitter NaN", site("", zoneZ+"\t\tjitter NaN"), []string{"jitter", `"NaN"`}},
		{"jitter nan", site("", zoneZ+"\t\tjitter nan"), []string{"jitter", `"nan"`}},
		{"jitter NaN%", site("", zoneZ+"\t\tjitter NaN%"), []string{"jitter", `"NaN%"`}},
		{"jitter Inf", site("", zoneZ+"\t\tjitter Inf"), []string{"jitter", `"Inf"`}},
		{"jitter negative", site("", zoneZ+"\t\tjitter -0.1"), []string{"jitter", "at least 0"}},
		{"jitter word", site("", zoneZ+"\t\tjitter lots"), []string{"jitter", `"lots"`}},
		// 13. caddy-ratelimit takes any fraction ≥ 0.
		{"jitter 1.5", site("", zoneZ+"\t\tjitter 1.5"), nil},
		{"jitter 250%", site("", zoneZ+"\t\tjitter 250%"), nil},
		// 9. Finer than the limiter's millisecond.
		{"window 1500us", site("", "\t\tzone z {\n\t\t\tevents 5\n\t\t\twindow 1500us\n\t\t}"), []string{`zone "z"`, "window", "whole number of milliseconds", "use 2ms"}},
		{"window 1999us", site("", "\t\tzone z {\n\t\t\tevents 5\n\t\t\twindow 1999us\n\t\t}"), []string{`zone "z"`, "whole number of milliseconds"}},
		{"window 1.5s", site("", "\t\tzone z {\n\t\t\tevents 5\n\t\t\twindow 1.5s\n\t\t}"), nil},
		// 10. The directive's sweep_interval beside the global option's store.
		{"sweep_interval with global store", site("\trate_limit {\n\t\tstore memory {\n\t\t\tmax_keys 1000\n\t\t}\n\t}\n", zoneZ+"\t\tsweep_interval 2m"), []string{"sweep_interval", "store memory { sweep_interval"}},
		{"sweep_interval with own store", site("", zoneZ+"\t\tstore memory\n\t\tsweep_interval 2m"), []string{"sweep_interval", "store memory { sweep_interval"}},
		{"sweep_interval alone", site("", zoneZ+"\t\tsweep_interval 2m"), nil},
		// 11. An unset environment variable, named at load.
		{"unset env url", site("", zoneZ+"\t\tstore redis {env.SLUICE_TEST_UNSET_URL}"), []string{"store redis", "url", "{env.SLUICE_TEST_UNSET_URL}", "SLUICE_TEST_UNSET_URL is not set"}},
		{"unset env password", site("", zoneZ+"\t\tstore redis {\n\t\t\turl redis://127.0.0.1:1\n\t\t\tpassword {env.SLUICE_TEST_UNSET_PW}\n\t\t}"), []string{"store redis", "password", "SLUICE_TEST_UNSET_PW is not set"}},
		// 12. 0 is caddy-ratelimit's "not set".
		{"ipv4_prefix 0", site("", "\t\tzone z {\n\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tipv4_prefix 0\n\t\t\tipv6_prefix 0\n\t\t}"), nil},
		{"ipv4_prefix -1", site("", "\t\tzone z {\n\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tipv4_prefix -1\n\t\t}"), []string{`zone "z"`, "ipv4_prefix"}},
		// 15. The same zone twice, as caddy-ratelimit accepts it.
		{"zone twice, same settings", site("", zoneZ+zoneZ), nil},
		{"zone twice, other settings", site("", zoneZ+"\t\tzone z {\n\t\t\tevents 6\n\t\t\twindow 1m\n\t\t}\n"), []string{`zone "z"`, "defined at Caddyfile:6", "other settings", "Caddyfile:10"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := validateCaddyfile(t, c.caddyfile)
			if c.want == nil {
				if err != nil {
					t.Fatalf("refused: %v\n%s", err, c.caddyfile)
				}
				return
			}
			if err == nil {
				t.Fatalf("loaded without error:\n%s", c.caddyfile)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestLoadChecks: a Caddyfile the grammar accepts but whose values break a
// rule adapts, and is refused at load (as JSON would be) with a message
// naming the zone, quoted, and the field.
func TestLoadChecks(t *testing.T) {
	zone := func(name, body string) string {
		return site("", "\t\tzone "+name+" {\n"+body+"\n\t\t}")
	}
	z1 := func(body string) string { return zone("z1", body) }
	twoSites := func(a, b string) string {
		return ":8080 {\n\trate_limit {\n\t\tzone shared {\n" + a + "\n\t\t}\n\t}\n\trespond ok\n}\n" +
			":8081 {\n\trate_limit {\n\t\tzone shared {\n" + b + "\n\t\t}\n\t}\n\trespond ok\n}\n"
	}
	cases := []struct {
		name, caddyfile string
		want            []string
	}{
		{"no zone", site("", ""), []string{"at least one zone"}},
		{"bad zone name", zone("\"a\x01b\"", "\t\t\tevents 1\n\t\t\twindow 1s"), []string{`zone "a\x01b"`, "control"}},
		{"zone name with spaces", zone("\"my zone\"", "\t\t\tevents 1"), []string{`zone "my zone"`, "window is required"}},
		{"missing events", z1("\t\t\twindow 1m"), []string{`zone "z1"`, "events (max_events) is required"}},
		{"missing window", z1("\t\t\tevents 5"), []string{`zone "z1"`, "window is required"}},
		{"sub-millisecond window", z1("\t\t\tevents 5\n\t\t\twindow 10us"), []string{`zone "z1"`, "window must be at least 1ms"}},
		{"too wide", z1("\t\t\tevents 5\n\t\t\twindow 1000000h\n\t\t\tburst 100000000"), []string{`zone "z1"`, "2^53"}},
		{"unknown algorithm", z1("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\talgorithm leaky"), []string{`zone "z1"`, "algorithm", `"leaky"`}},
		{"ipv4 prefix too big", z1("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tipv4_prefix 33"), []string{`zone "z1"`, "ipv4_prefix must be between 0 and 32"}},
		{"ipv6 prefix too big", z1("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tipv6_prefix 129"), []string{`zone "z1"`, "ipv6_prefix must be between 0 and 128"}},
		{"burst with a window algorithm", z1("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tburst 9\n\t\t\talgorithm sliding_log"), []string{`zone "z1"`, "burst is not allowed"}},
		{"sliding log too large", z1("\t\t\tevents 1000000\n\t\t\twindow 1m\n\t\t\talgorithm sliding_log"), []string{`zone "z1"`, "sliding_log"}},
		{"static cost 0", z1("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tcost 0"), []string{`zone "z1"`, "cost must be a positive integer"}},
		{"unknown fail policy", z1("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tfail sometimes"), []string{`zone "z1"`, "fail", `"sometimes"`, "(known: open, closed, local)"}},
		{"bad key", z1("\t\t\tkey {unclosed\n\t\t\tevents 5\n\t\t\twindow 1m"), []string{`zone "z1"`, "key"}},
		{"bad headers", site("", zoneZ+"\t\theaders loud"), []string{"headers", `"loud"`, "(known: legacy, draft, both, off)"}},
		{"bad response status", site("", zoneZ+"\t\tresponse {\n\t\t\tstatus 200\n\t\t}"), []string{"response", "status must be between 400 and 599"}},
		{"response problem with a body", site("", zoneZ+"\t\tresponse problem {\n\t\t\tbody x\n\t\t}"), []string{"response", "problem", "not body"}},
		// One name in two directives: one bucket, so one limit; the error
		// names both limits.
		{"same zone, two limits", twoSites("\t\t\tevents 5\n\t\t\twindow 1m", "\t\t\tevents 50\n\t\t\twindow 1m"),
			[]string{`zone "shared"`, "events 5 window 1m0s", "events 50 window 1m0s", "another rate_limit handler"}},
		{"same zone, two stores", twoSites("\t\t\tevents 5\n\t\t\twindow 1m", "\t\t\tevents 5\n\t\t\twindow 1m\n\t\t}\n\t\tstore memory {\n\t\t\tmax_keys 7"),
			[]string{`zone "shared"`, "store"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := adapt(t, c.caddyfile); err != nil {
				t.Fatalf("refused at adapt time, want at load: %v", err)
			}
			err := validateCaddyfile(t, c.caddyfile)
			if err == nil {
				t.Fatalf("loaded without error:\n%s", c.caddyfile)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestPrefixZeroMeansDefault: ipv4_prefix 0 / ipv6_prefix 0 give the
// defaults (/32, /64), in the Caddyfile as in JSON.
func TestPrefixZeroMeansDefault(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone z {
			events 5
			window 1m
			ipv4_prefix 0
			ipv6_prefix 0
		}
	}`, nil)
	v4, v6 := h.zones[0].deriver.Prefixes()
	if v4 != defaultIPv4Prefix || v6 != defaultIPv6Prefix {
		t.Fatalf("prefixes /%d /%d, want /%d /%d", v4, v6, defaultIPv4Prefix, defaultIPv6Prefix)
	}
}

// TestHugeJitterIsBounded: a jitter far above 1 neither overflows nor
// shortens Retry-After.
func TestHugeJitterIsBounded(t *testing.T) {
	for _, j := range []float64{1.5, 1e6, 1e300} {
		h := &Handler{Jitter: j}
		for range 100 {
			s := h.retryAfterSeconds(10_000_000_000) // 10s
			if s < 10 {
				t.Fatalf("jitter %g: Retry-After %d, below the 10 s it was", j, s)
			}
			if j == 1.5 && s > 25 {
				t.Fatalf("jitter 1.5: Retry-After %d, above 10 s + 150%%", s)
			}
		}
	}
}
