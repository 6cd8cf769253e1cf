package simulate_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/caddy-sluice/simulate"
)

// TestReplayWithOverrides: a file of overrides in force during the replay
// decides its keys as the admin API's would: 600 requests of one client in
// a minute against 100 a minute; raised to 1000 a minute it is refused
// nothing, blocked it is admitted nothing, and an override that ends half
// way through restores the zone's limit from then on.
func TestReplayWithOverrides(t *testing.T) {
	cfg := adapt(t, edgeConfig)
	traffic := "steady:rate=10,duration=1m,path=/api/x,start=2026-01-01T00:00:00Z"
	run := func(file string) (allowed, refused int64) {
		t.Helper()
		o := simulate.Options{Config: cfg, Traffic: traffic}
		if file != "" {
			p := filepath.Join(t.TempDir(), "overrides.json")
			if err := os.WriteFile(p, []byte(file), 0o644); err != nil {
				t.Fatal(err)
			}
			ovs, err := simulate.LoadKeyOverrides(p)
			if err != nil {
				t.Fatal(err)
			}
			o.KeyOverrides = ovs
		}
		rep, err := simulate.Run(o)
		if err != nil {
			t.Fatal(err)
		}
		z := rep.Zones[0]
		return z.Allowed, z.Refused
	}
	baseA, baseR := run("")
	if baseR == 0 {
		t.Fatalf("without overrides: allowed %d refused %d, want refusals", baseA, baseR)
	}
	if a, r := run(`{"overrides": [{"zone": "api", "key": "198.18.0.1", "events": 1000, "window": "1m"}]}`); a != 600 || r != 0 {
		t.Errorf("raised: allowed %d refused %d, want 600 and 0", a, r)
	}
	if a, r := run(`{"overrides": [{"zone": "api", "key": "198.18.0.1", "block": true}]}`); a != 0 || r != 600 {
		t.Errorf("blocked: allowed %d refused %d, want 0 and 600", a, r)
	}
	a, r := run(`{"overrides": [{"zone": "api", "key": "198.18.0.1", "unlimited": true, "until": "2026-01-01T00:00:30Z"}]}`)
	if a <= baseA || r == 0 || a+r != 600 {
		t.Errorf("unlimited for 30s of 60: allowed %d refused %d (without: %d, %d)", a, r, baseA, baseR)
	}
	t.Logf("without: %d/%d; unlimited for the first half: %d/%d", baseA, baseR, a, r)
	for _, bad := range []string{
		`{"overrides": [{"zone": "nope", "key": "198.18.0.1", "block": true}]}`,
		`{"overrides": [{"zone": "api", "key": "198.18.0.1", "events": 10}]}`,
		`{"overrides": [{"zone": "api", "key": "198.18.0.1", "block": true, "unlimited": true}]}`,
	} {
		p := filepath.Join(t.TempDir(), "bad.json")
		_ = os.WriteFile(p, []byte(bad), 0o644)
		ovs, err := simulate.LoadKeyOverrides(p)
		if err == nil {
			_, err = simulate.Run(simulate.Options{Config: cfg, Traffic: traffic, KeyOverrides: ovs})
		}
		if err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
