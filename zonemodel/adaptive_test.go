package zonemodel

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluicehq/caddy-sluice/adaptive"
	"github.com/sluicehq/caddy-sluice/algorithms"
)

// TestAdaptiveCompile: `"adaptive": {}` is an adaptive zone with every
// default; its limit is a concurrency limit at the initial value, its
// settings and delay go to Compiled, and its description carries them
// (one zone name, one set of settings); fields of a rate are refused
// naming them.
func TestAdaptiveCompile(t *testing.T) {
	var z Zone
	if err := json.Unmarshal([]byte(`{"adaptive": {}, "delay": "250ms"}`), &z); err != nil {
		t.Fatal(err)
	}
	z.SetDefaults()
	c, err := z.Compile("backend")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := adaptive.Settings{}.Resolve()
	if c.Adaptive == nil || *c.Adaptive != want || c.AdaptiveWait.Milliseconds() != 250 {
		t.Fatalf("compiled adaptive %+v wait %s, want %+v and 250ms", c.Adaptive, c.AdaptiveWait, want)
	}
	if c.Limit.Algorithm != algorithms.Concurrency || c.Limit.Events != adaptive.DefaultInitial || c.Limit.Delay != 0 {
		t.Fatalf("limit %+v, want a concurrency limit at %d without a delay", c.Limit, adaptive.DefaultInitial)
	}
	if !strings.Contains(c.DynamicSpec, "controller aimd") || !strings.Contains(c.DynamicSpec, "delay 250ms") {
		t.Fatalf("description %q", c.DynamicSpec)
	}
	z.MaxEvents = 5
	if _, err := z.Compile("backend"); err == nil || !strings.HasPrefix(err.Error(), "events (max_events) does not apply to an adaptive") {
		t.Fatalf("events in an adaptive zone: %v", err)
	}
}
