package sluice

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestLocalAllowanceCaddyfile: `local_allowance [<max_batch> [<expiry>]]`
// parses into Zone.LocalAllowance.
func TestLocalAllowanceCaddyfile(t *testing.T) {
	for _, c := range []struct {
		line   string
		max    int64
		expiry time.Duration
		err    string
	}{
		{line: "local_allowance"},
		{line: "local_allowance 50", max: 50},
		{line: "local_allowance 50 250ms", max: 50, expiry: 250 * time.Millisecond},
		{line: "local_allowance 0", err: "at least 1"},
		{line: "local_allowance x", err: "integer"},
		{line: "local_allowance 5 1s 2", err: "at most a batch size and an expiry"},
	} {
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`rate_limit {
			zone z {
				events 100
				window 1m
				` + c.line + `
			}
		}`))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want one saying %q", c.line, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.line, err)
			continue
		}
		la := h.RateLimits["z"].LocalAllowance
		if la == nil || la.MaxBatch != c.max || time.Duration(la.Expiry) != c.expiry {
			t.Errorf("%q: %+v, want max %d expiry %s", c.line, la, c.max, c.expiry)
		}
	}
}

// TestLocalAllowanceNeedsRedis: the memory store decides every request
// locally already; the setting is refused with it.
func TestLocalAllowanceNeedsRedis(t *testing.T) {
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`rate_limit {
		zone z {
			events 100
			window 1m
			local_allowance
		}
	}`)); err != nil {
		t.Fatal(err)
	}
	err := h.Provision(caddyContext(t))
	_ = h.Cleanup()
	if err == nil || !strings.Contains(err.Error(), "store redis") {
		t.Errorf("Provision: %v, want a refusal naming store redis", err)
	}
}

// TestLocalAllowanceCombinations: the settings that need every request of a
// key decided by the store are refused beside a local allowance, naming
// the zone and the setting.
func TestLocalAllowanceCombinations(t *testing.T) {
	for _, c := range []struct{ lines, setting string }{
		{"events 100\nwindow 1m\ncount 401", "count"},
		{"events 100\nwindow 1m\npenalty 1m", "penalty"},
		{"events 100\nwindow 1m\ndelay 1s", "delay"},
		{"concurrent 10", "concurrent"},
	} {
		h := new(Handler)
		// Refused by the Caddyfile adapter (which runs the load checks).
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("rate_limit {\nzone z {\n" + c.lines + "\nlocal_allowance\n}\n}"))
		if err == nil || !strings.Contains(err.Error(), `"z"`) || !strings.Contains(err.Error(), "local_allowance: not with "+c.setting) {
			t.Errorf("%s: %v, want a refusal naming zone z, local_allowance and %s", c.setting, err, c.setting)
		}
	}
}
