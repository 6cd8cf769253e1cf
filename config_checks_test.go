package sluice

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/zonemodel"
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
		t.Run(c.name, func(t *testing.T) { expectConfig(t, c.caddyfile, c.want) })
	}
}

// expectConfig validates caddyfile: it must load (want nil), or be refused
// with an error that mentions every string of want.
func expectConfig(t *testing.T, caddyfile string, want []string) {
	t.Helper()
	err := validateCaddyfile(t, caddyfile)
	if want == nil {
		if err != nil {
			t.Fatalf("refused: %v\n%s", err, caddyfile)
		}
		return
	}
	if err == nil {
		t.Fatalf("loaded without error:\n%s", caddyfile)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// TestLoadChecks: what only the whole configuration can tell (one zone
// name in two directives) adapts, and is refused at load, naming the zone;
// the values of one directive are refused as it is adapted
// (TestValueErrorsNameTheLine).
func TestLoadChecks(t *testing.T) {
	twoSites := func(a, b string) string {
		return ":8080 {\n\trate_limit {\n\t\tzone shared {\n" + a + "\n\t\t}\n\t}\n\trespond ok\n}\n" +
			":8081 {\n\trate_limit {\n\t\tzone shared {\n" + b + "\n\t\t}\n\t}\n\trespond ok\n}\n"
	}
	cases := []struct {
		name, caddyfile string
		want            []string
	}{
		// One name in two directives: one bucket, so one limit; the error
		// names both limits.
		{"same zone, two limits", twoSites("\t\t\tevents 5\n\t\t\twindow 1m", "\t\t\tevents 50\n\t\t\twindow 1m"),
			[]string{`zone "shared"`, "events 5 window 1m0s", "events 50 window 1m0s", "another rate_limit handler"}},
		{"same zone, two stores", twoSites("\t\t\tevents 5\n\t\t\twindow 1m", "\t\t\tevents 5\n\t\t\twindow 1m\n\t\t}\n\t\tstore memory {\n\t\t\tmax_keys 7"),
			[]string{`zone "shared"`, "store"}},
		// The directive's sweep_interval beside the global option's store:
		// the store is known once the option is applied.
		{"sweep_interval with global store", site("\trate_limit {\n\t\tstore memory {\n\t\t\tmax_keys 1000\n\t\t}\n\t}\n", zoneZ+"\t\tsweep_interval 2m"),
			[]string{"sweep_interval", "store memory { sweep_interval"}},
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
	if v4 != zonemodel.DefaultIPv4Prefix || v6 != zonemodel.DefaultIPv6Prefix {
		t.Fatalf("prefixes /%d /%d, want /%d /%d", v4, v6, zonemodel.DefaultIPv4Prefix, zonemodel.DefaultIPv6Prefix)
	}
}

// TestHugeJitterIsBounded: a jitter far above 1 neither overflows nor
// shortens Retry-After.
func TestHugeJitterIsBounded(t *testing.T) {
	for _, j := range []float64{1.5, 1e6, 1e300} {
		h := &Handler{Jitter: j}
		for range 100 {
			s := h.resp.RetryAfter(10_000_000_000) // 10s
			if s < 10 {
				t.Fatalf("jitter %g: Retry-After %d, below the 10 s it was", j, s)
			}
			if j == 1.5 && s > 25 {
				t.Fatalf("jitter 1.5: Retry-After %d, above 10 s + 150%%", s)
			}
		}
	}
}

// TestValueErrorsNameTheLine (issue 23, item 9): every value the grammar
// reads but a rule refuses is refused when the Caddyfile is adapted, naming
// the zone, the field and the file:line of the field (the line marked
// #here; the zone's line where the error is about a field not written).
// One case per rule of a zone, and the directive's own.
func TestValueErrorsNameTheLine(t *testing.T) {
	zone := func(body string) string { return site("", "\t\tzone z1 {\n"+body+"\n\t\t} #zone") }
	rate := func(extra string) string { return zone("\t\t\tevents 5\n\t\t\twindow 1m\n" + extra) }
	conc := func(extra string) string { return zone("\t\t\tconcurrent 5\n" + extra) }
	store := func(spec string) string { return site("", zoneZ+"\t\tstore "+spec) }
	redis := func(field string) string { return store("redis redis://127.0.0.1:1 {\n\t\t\t" + field + "\n\t\t}") }
	cases := []struct {
		name, caddyfile string
		want            []string
	}{
		// The cases the issue lists.
		{"count 99", rate("\t\t\tcount 99 #here"), []string{`zone "z1"`, "count", `"99"`}},
		{"count 6xx", rate("\t\t\tcount 401 6xx #here"), []string{`zone "z1"`, "count", `"6xx"`}},
		{"lease 1ns", conc("\t\t\tlease 1ns #here"), []string{`zone "z1"`, "lease"}},
		{"concurrent 1000001", zone("\t\t\tconcurrent 1000001 #here"), []string{`zone "z1"`, "concurrent must be between 1 and 1000000"}},
		{"delay_after above the capacity", rate("\t\t\tdelay 1s\n\t\t\tdelay_after 6 #here"), []string{`zone "z1"`, "delay_after", "capacity 5"}},
		// The other rules of a rate zone.
		{"count reversed range", rate("\t\t\tcount 599-500 #here"), []string{`zone "z1"`, "count"}},
		{"window 1500us", zone("\t\t\tevents 5\n\t\t\twindow 1500us #here"), []string{`zone "z1"`, "window", "whole number of milliseconds"}},
		{"window 10us", zone("\t\t\tevents 5\n\t\t\twindow 10us #here"), []string{`zone "z1"`, "window must be at least 1ms"}},
		{"missing window", zone("\t\t\tevents 5"), []string{`zone "z1"`, "window is required"}},
		{"missing events", zone("\t\t\twindow 1m"), []string{`zone "z1"`, "events (max_events) is required"}},
		{"too wide", zone("\t\t\tevents 5 #here\n\t\t\twindow 1000000h\n\t\t\tburst 100000000"), []string{`zone "z1"`, "2^53"}},
		{"unknown algorithm", rate("\t\t\talgorithm leaky #here"), []string{`zone "z1"`, "algorithm", `"leaky"`}},
		{"burst with a window algorithm", rate("\t\t\tburst 9 #here\n\t\t\talgorithm sliding_log"), []string{`zone "z1"`, "burst is not allowed"}},
		{"sliding log too large", zone("\t\t\tevents 1000000 #here\n\t\t\twindow 1m\n\t\t\talgorithm sliding_log"), []string{`zone "z1"`, "sliding_log"}},
		{"cost 0", rate("\t\t\tcost 0 #here"), []string{`zone "z1"`, "cost must be a positive integer"}},
		{"cost above the capacity", rate("\t\t\tcost 6 #here"), []string{`zone "z1"`, "cost 6 exceeds the zone's capacity 5"}},
		{"cost default above the capacity", rate("\t\t\tcost {cost} 6 #here"), []string{`zone "z1"`, "cost_default 6 exceeds"}},
		{"ipv4_prefix 33", rate("\t\t\tipv4_prefix 33 #here"), []string{`zone "z1"`, "ipv4_prefix must be between 0 and 32"}},
		{"ipv4_prefix -1", rate("\t\t\tipv4_prefix -1 #here"), []string{`zone "z1"`, "ipv4_prefix"}},
		{"ipv6_prefix 129", rate("\t\t\tipv6_prefix 129 #here"), []string{`zone "z1"`, "ipv6_prefix must be between 0 and 128"}},
		{"unknown fail policy", rate("\t\t\tfail sometimes #here"), []string{`zone "z1"`, "fail", `"sometimes"`}},
		{"bad key", rate("\t\t\tkey {unclosed #here"), []string{`zone "z1"`, "key"}},
		{"unknown on_exceed", rate("\t\t\ton_exceed drop #here"), []string{`zone "z1"`, "on_exceed", `"drop"`}},
		{"report_only and on_exceed pass", rate("\t\t\treport_only #here\n\t\t\ton_exceed pass"), []string{`zone "z1"`, "report_only and on_exceed pass"}},
		{"penalty 1ns", rate("\t\t\tpenalty 1ns #here"), []string{`zone "z1"`, "penalty must be at least 1ms"}},
		{"penalty 1500us", rate("\t\t\tpenalty 1500us #here"), []string{`zone "z1"`, "penalty", "whole number of milliseconds"}},
		{"delay 1ns", rate("\t\t\tdelay 1ns #here"), []string{`zone "z1"`, "delay must be at least 1ms"}},
		{"delay on a window algorithm", rate("\t\t\talgorithm sliding_window\n\t\t\tdelay 1s #here"), []string{`zone "z1"`, "delay"}},
		{"delay_after without delay", rate("\t\t\tdelay_after 2 #here"), []string{`zone "z1"`, "delay_after needs delay"}},
		{"max_overrides 100001", rate("\t\t\tmax_overrides 100001 #here"), []string{`zone "z1"`, "max_overrides must be between 1 and 100000"}},
		{"max_overrides on a concurrency zone", conc("\t\t\tmax_overrides 10 #here"), []string{`zone "z1"`, "max_overrides does not apply to a concurrency zone"}},
		{"local_allowance with count", rate("\t\t\tcount 401\n\t\t\tlocal_allowance #here"), []string{`zone "z1"`, "local_allowance", "count"}},
		{"events placeholder, burst_from on sliding_window", zone("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\talgorithm sliding_window\n\t\t\tburst {plan_burst} 3 #here"), []string{`zone "z1"`, "burst"}},
		// The rules of a concurrency zone.
		{"lease 25h", conc("\t\t\tlease 25h #here"), []string{`zone "z1"`, "lease must be between"}},
		{"lease 1500us", conc("\t\t\tlease 1500us #here"), []string{`zone "z1"`, "lease", "whole number of milliseconds"}},
		{"lease without concurrent", rate("\t\t\tlease 1m #here"), []string{`zone "z1"`, "lease applies only to a concurrency zone"}},
		{"concurrent with events", zone("\t\t\tconcurrent 5\n\t\t\tevents 5 #here"), []string{`zone "z1"`, "events (max_events) does not apply to a concurrency zone"}},
		{"concurrent with count", conc("\t\t\tcount 5xx #here"), []string{`zone "z1"`, "count does not apply"}},
		{"concurrent with penalty", conc("\t\t\tpenalty 1m #here"), []string{`zone "z1"`, "penalty does not apply"}},
		{"concurrent with delay", conc("\t\t\tdelay 1s #here"), []string{`zone "z1"`, "delay does not apply"}},
		// A zone's name.
		{"zone name with spaces", site("", "\t\tzone \"my zone\" { #here\n\t\t\tevents 1\n\t\t}"), []string{`zone "my zone"`, "window is required"}},
		{"bad zone name", site("", "\t\tzone \"a\x01b\" { #here\n\t\t\tevents 1\n\t\t\twindow 1s\n\t\t}"), []string{`zone "a\x01b"`, "control"}},
		// The directive's own values.
		{"no zone", site("", "\t\tjitter 0.1"), []string{"at least one zone"}},
		{"bad headers", site("", zoneZ+"\t\theaders loud #here"), []string{"headers", `"loud"`}},
		{"sweep_interval 1ns", site("", zoneZ+"\t\tsweep_interval 1ns #here"), []string{"sweep_interval", "at least 1s"}},
		{"sweep_interval beside a store", site("", zoneZ+"\t\tstore memory\n\t\tsweep_interval 2m #here"), []string{"sweep_interval", "store memory { sweep_interval"}},
		{"bad response status", site("", zoneZ+"\t\tresponse { #here\n\t\t\tstatus 200\n\t\t}"), []string{"response", "status must be between 400 and 599"}},
		{"response problem with a body", site("", zoneZ+"\t\tresponse problem { #here\n\t\t\tbody x\n\t\t}"), []string{"response", "problem", "not body"}},
		{"store memory sweep_interval 1ns", site("", zoneZ+"\t\tstore memory {\n\t\t\tsweep_interval 1ns #here\n\t\t}"), []string{"store memory", "sweep_interval", "at least 1s"}},
		// The stores' own values (a value holding a placeholder is checked at
		// load: TestStorePlaceholderCheckedAtLoad).
		{"store memory max_keys huge", store("memory {\n\t\t\tmax_keys 99999999999999 #here\n\t\t}"), []string{"store memory", "max_keys must be between 1 and 1000000000"}},
		{"store redis url ftp", store("redis ftp://x #here"), []string{"store redis", "url", `unsupported scheme "ftp"`}},
		{"store redis url in the block", store("redis {\n\t\t\turl ftp://x #here\n\t\t}"), []string{"store redis", "url", `unsupported scheme "ftp"`}},
		{"store redis url bad db", store("redis redis://127.0.0.1:1/x #here"), []string{"store redis", "url"}},
		{"store redis sentinel without master", store("redis redis+sentinel://127.0.0.1:1 #here"), []string{"store redis", "url", "master_name"}},
		{"store redis cluster address", store("redis {\n\t\t\tcluster 127.0.0.1 #here\n\t\t}"), []string{"store redis", "cluster address"}},
		{"store redis timeout 1ns", redis("timeout 1ns #here"), []string{"store redis", "timeout must be between 1ms and 1m0s"}},
		{"store redis timeout 2m", redis("timeout 2m #here"), []string{"store redis", "timeout must be between 1ms and 1m0s"}},
		{"store redis late_reply_grace 1ns", redis("late_reply_grace 1ns #here"), []string{"store redis", "late_reply_grace must be 0 (off) or between 1ms and 1s"}},
		{"store redis key_prefix with a space", redis("key_prefix \"a b\" #here"), []string{"store redis", "key_prefix", `"a b"`}},
		{"store redis key_prefix with a glob", redis("key_prefix app* #here"), []string{"store redis", "key_prefix", `"app*"`}},
		{"store redis key_prefix too long", redis("key_prefix " + strings.Repeat("p", 129) + " #here"), []string{"store redis", "key_prefix", "at most 128 bytes"}},
		{"store redis deny_cache_size 1", redis("deny_cache_size 1 #here"), []string{"store redis", "deny_cache_size must be 0 (off) or between 100 and 100000000"}},
		{"store redis deny_cache_size huge", redis("deny_cache_size 1000000000 #here"), []string{"store redis", "deny_cache_size must be 0 (off) or between 100 and 100000000"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mark := "#here"
			if !strings.Contains(c.caddyfile, mark) {
				mark = "#zone" // the zone's closing line: the error names its opening line
				if !strings.Contains(c.caddyfile, mark) {
					mark = "rate_limit {"
				}
			}
			line := 1 + strings.Count(c.caddyfile[:strings.Index(c.caddyfile, mark)], "\n")
			if mark == "#zone" {
				line = 1 + strings.Count(c.caddyfile[:strings.Index(c.caddyfile, "zone z1 {")], "\n")
			}
			_, err := adapt(t, c.caddyfile)
			if err == nil {
				t.Fatalf("adapted without error, want the error at Caddyfile:%d:\n%s", line, c.caddyfile)
			}
			want := append(c.want, fmt.Sprintf(", at Caddyfile:%d", line))
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestJSONConcurrentZero (issue 23, item 9): a JSON zone with
// "concurrent": 0 is refused naming concurrent, not events; a rate zone
// that writes "concurrent": 0 beside its rate loads as it did.
func TestJSONConcurrentZero(t *testing.T) {
	load := func(zones string) error {
		js := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":[":0"],"routes":[{"handle":[{"handler":"rate_limit","rate_limits":` + zones + `}]}]}}}}}`
		var cfg caddy.Config
		if err := json.Unmarshal([]byte(js), &cfg); err != nil {
			t.Fatal(err)
		}
		return caddy.Validate(&cfg)
	}
	err := load(`{"c":{"key":"{http.request.header.X-User}","concurrent":0}}`)
	if err == nil || !strings.Contains(err.Error(), `zone "c"`) || !strings.Contains(err.Error(), "concurrent must be between 1 and 1000000, got 0") {
		t.Fatalf("error %v, want it to name zone \"c\" and concurrent", err)
	}
	if err := load(`{"r":{"max_events":5,"window":"1m","concurrent":0}}`); err != nil {
		t.Fatalf("a rate zone with \"concurrent\": 0: %v", err)
	}
	// A zone is still read strictly.
	if err := load(`{"r":{"max_events":5,"window":"1m","colour":1}}`); err == nil || !strings.Contains(err.Error(), `unknown field "colour"`) {
		t.Fatalf("an unknown zone field: %v", err)
	}
}

// TestStorePlaceholderCheckedAtLoad (issue 23, item 9): a store value
// holding a placeholder adapts, and is checked once resolved, at load.
func TestStorePlaceholderCheckedAtLoad(t *testing.T) {
	t.Setenv("SLUICE_TEST_STORE_URL", "")
	cf := site("", zoneZ+"\t\tstore redis {env.SLUICE_TEST_STORE_URL}")
	if _, err := adapt(t, cf); err != nil {
		t.Fatalf("refused at adapt time, want at load: %v", err)
	}
	err := validateCaddyfile(t, cf)
	if err == nil || !strings.Contains(err.Error(), "url") || !strings.Contains(err.Error(), "SLUICE_TEST_STORE_URL is not set") {
		t.Fatalf("error %v, want it to name url and the unset variable", err)
	}
}

// TestJSONStoreValueErrors (issue 23, item 9): a JSON store value out of
// bounds is refused at load, naming the store and the field.
func TestJSONStoreValueErrors(t *testing.T) {
	for _, c := range []struct{ store, want string }{
		{`{"module":"redis","url":"ftp://x"}`, `url: unsupported scheme "ftp"`},
		{`{"module":"redis","url":"redis://127.0.0.1:1","timeout":"1ns"}`, "timeout must be between"},
		{`{"module":"redis","url":"redis://127.0.0.1:1","late_reply_grace":"1ns"}`, "late_reply_grace must be"},
		{`{"module":"redis","url":"redis://127.0.0.1:1","key_prefix":"a b"}`, "key_prefix"},
		{`{"module":"redis","url":"redis://127.0.0.1:1","deny_cache_size":1}`, "deny_cache_size must be"},
		{`{"module":"memory","max_keys":99999999999999}`, "max_keys must be between"},
	} {
		js := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":[":0"],"routes":[{"handle":[{"handler":"rate_limit","store":` + c.store +
			`,"rate_limits":{"z":{"max_events":5,"window":"1m"}}}]}]}}}}}`
		var cfg caddy.Config
		if err := json.Unmarshal([]byte(js), &cfg); err != nil {
			t.Fatal(err)
		}
		err := caddy.Validate(&cfg)
		if err == nil || !strings.Contains(err.Error(), "store") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("store %s: error %v, want it to mention %q", c.store, err, c.want)
		}
	}
}

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
