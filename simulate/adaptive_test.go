package simulate_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/caddy-sluice/simulate"
)

// TestAdaptiveZoneNotReplayed: an adaptive concurrency zone in a replay
// refuses nothing (the replay is sequential), and the report says it
// cannot be replayed, and why.
func TestAdaptiveZoneNotReplayed(t *testing.T) {
	cfg := adapt(t, `{
	admin off
}
:8080 {
	rate_limit {
		zone backend {
			key static
			concurrent adaptive {
				minimum 1
				maximum 1
			}
		}
	}
	reverse_proxy localhost:9
}`)
	var log strings.Builder
	for range 20 {
		log.WriteString(accessLine(1.7e9, "192.0.2.7", "GET", "/report", "") + "\n")
	}
	p := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(p, []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
	if err != nil {
		t.Fatal(err)
	}
	for _, z := range rep.Zones {
		if z.Name == "backend" && z.Refused != 0 {
			t.Errorf("backend refused %d in a sequential replay", z.Refused)
		}
	}
	var table strings.Builder
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "zone backend: an adaptive concurrency zone (concurrent adaptive): it cannot be replayed") {
		t.Errorf("the table does not say the adaptive zone cannot be replayed:\n%s", table.String())
	}
}
