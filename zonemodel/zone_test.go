package zonemodel

import (
	"encoding/json"
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// compile reads a zone's JSON as Caddy does, sets the defaults and compiles
// it.
func compile(t *testing.T, js string) (*Compiled, error) {
	t.Helper()
	z := new(Zone)
	if err := json.Unmarshal([]byte(js), z); err != nil {
		return nil, err
	}
	z.SetDefaults()
	return z.Compile("z")
}

// TestCompileDefaults: what a zone that sets only its limit compiles to.
func TestCompileDefaults(t *testing.T) {
	c, err := compile(t, `{"max_events":5,"window":"1m"}`)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := c.Deriver.Prefixes()
	if c.Limit != (algorithms.Limit{Algorithm: algorithms.TokenBucket, Events: 5, Window: 60_000}) || c.Cost != 1 || c.CostFrom != nil ||
		c.Fail != FailOpen || !c.Enabled || c.ReportOnly || c.Dynamic() || c.Concurrent() != 0 || v4 != 32 || v6 != 64 ||
		len(c.Deriver.Candidates()) != 1 || c.Deriver.Candidates()[0].String() != DefaultKey {
		t.Errorf("compiled %+v, prefixes /%d /%d", *c, v4, v6)
	}
	c, err = compile(t, `{"concurrent":3,"concurrent_from":"{http.request.header.X-Slots}"}`)
	if err != nil {
		t.Fatal(err)
	}
	if c.Concurrent() != 3 || c.Limit.Window != DefaultLease.Milliseconds() || !c.Dynamic() || c.DynamicSpec != "concurrent_from {http.request.header.X-Slots}" {
		t.Errorf("concurrency zone compiled %+v", *c)
	}
}

// TestCompileErrorsNameTheField: a few of the checks, word for word (the
// root package's config tests cover the rest through the Caddyfile).
func TestCompileErrorsNameTheField(t *testing.T) {
	for js, want := range map[string]string{
		`{"window":"1m"}`:  "events (max_events) is required",
		`{"concurrent":0}`: "concurrent must be between 1 and 1000000, got 0",
		`{"max_events":5,"window":"1m","penalty":"1500us"}`:                      "penalty must be a whole number of milliseconds, got 1.5ms",
		`{"max_events":5,"window":"1m","algorithm":"fixed_window","delay":"1s"}`: "delay: fixed_window: " + algorithms.ErrDelayNotAllowed.Error(),
		`{"max_events":5,"window":"1m","cost":"9"}`:                              "cost 9 exceeds the zone's capacity 5: no request could ever pass",
		`{"max_events":5,"window":"1m","fail":"maybe"}`:                          `fail: unknown policy "maybe" (known: open, closed, local)`,
		`{"max_events":5,"window":"1m","max_overrides":100001}`:                  "max_overrides must be between 1 and 100000 (0: the default, 1000), got 100001",
		`{"concurrent":3,"max_overrides":10}`:                                    "max_overrides does not apply to a concurrency zone: overrides change a rate zone's limit",
	} {
		if _, err := compile(t, js); err == nil || err.Error() != want {
			t.Errorf("%s: error %v, want %q", js, err, want)
		}
	}
	if err := ValidName(string(make([]byte, MaxNameLen+1))); err == nil {
		t.Error("a name over MaxNameLen is accepted")
	}
}
