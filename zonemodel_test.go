package sluice

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/simulate"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// modelCoverage is a config whose zones lean on every default (key,
// algorithm, prefixes, fail, cost, lease, enabled) and on each setting that
// changes what the simulator reports (a concurrency zone, a limit and a cost
// chosen per request, report_only from the directive, zones switched off).
const modelCoverage = `:8080 {
	rate_limit {
		zone bare {
			events 5
			window 1m
		}
		zone full {
			key {http.request.header.X-User} {client_ip}
			events 100
			window 10s
			burst 150
			algorithm gcra
			cost {http.request.header.X-Cost} 2
			ipv4_prefix 24
			ipv6_prefix 48
			fail closed
			penalty 30s
			delay 2s
			delay_after 10
		}
		zone plan {
			events {http.request.header.X-Events} 10
			window 1m
			burst {http.request.header.X-Burst} 20
		}
		zone slots {
			concurrent 4
		}
		zone slots_from {
			concurrent {http.request.header.X-Slots} 2
			lease 30s
		}
		zone off {
			events 1
			window 1s
			enabled false
		}
	}
	route /dry {
		rate_limit {
			report_only
			zone dry {
				events 3
				window 1s
				algorithm sliding_window
				count 4xx
			}
		}
	}
	route /down {
		rate_limit {
			enabled false
			zone down {
				events 3
				window 1s
			}
		}
	}
	respond "ok"
}
`

// TestZoneModelOneSource: the simulator's view of every zone is the
// handler's own compiled zone (zonemodel compiles both: no second copy of
// the schema or its defaults), for the examples, the adapt fixtures, the
// demo Caddyfile and a config that leans on every default.
func TestZoneModelOneSource(t *testing.T) {
	files, _ := filepath.Glob("examples/*.Caddyfile")
	fixtures, _ := filepath.Glob("testdata/adapt/*.caddyfile")
	files = append(append(files, fixtures...), "Caddyfile.example")
	srcs := map[string]string{"coverage": modelCoverage}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		srcs[f] = string(b)
	}
	compared := 0
	for _, name := range slices.Sorted(maps.Keys(srcs)) {
		t.Run(name, func(t *testing.T) {
			js, err := adapt(t, srcs[name])
			if err != nil {
				t.Fatal(err)
			}
			compared += compareZoneViews(t, js)
		})
	}
	if len(files) < 10 || compared < 30 {
		t.Fatalf("compared %d zones of %d configs: the examples or fixtures went missing", compared, len(files)+1)
	}
}

// compareZoneViews loads a config in the simulator and provisions each of
// its rate_limit handlers, and compares the zones; it returns how many it
// compared.
func compareZoneViews(t *testing.T, js []byte) int {
	t.Helper()
	e, err := simulate.NewEngine(js, simulate.EngineOptions{})
	if err != nil {
		t.Fatalf("simulator: %v", err)
	}
	defer e.Close()
	sim := map[string]*simulate.ZoneConfig{}
	for _, z := range e.Zones() {
		sim[z.Name] = z
	}
	var raw any
	if err := json.Unmarshal(js, &raw); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, hj := range rateLimitHandlers(raw) {
		h := new(Handler)
		if err := json.Unmarshal(hj, h); err != nil {
			t.Fatal(err)
		}
		h.StoreRaw = nil // the memory store: the zones do not depend on it
		for _, z := range h.RateLimits {
			z.Sync = nil // the asynchronous mode is the Redis store's
		}
		if err := h.Provision(caddyContext(t)); err != nil {
			t.Fatalf("provision: %v", err)
		}
		for name := range h.RateLimits {
			s := sim[name]
			if s == nil {
				t.Errorf("zone %q: not in the simulator's zones", name)
				continue
			}
			i := slices.IndexFunc(h.zones, func(z *zone) bool { return z.name == name })
			if !s.Enabled {
				if i >= 0 && h.enabled {
					t.Errorf("zone %q: the simulator says switched off, the handler decides with it", name)
				}
				continue
			}
			if i < 0 || !h.enabled {
				t.Errorf("zone %q: the simulator says enabled, the handler has it off", name)
				continue
			}
			sameAsHandler(t, s, h.zones[i])
			n++
		}
		_ = h.Cleanup()
	}
	return n
}

// sameAsHandler compares the simulator's view of a zone with the handler's.
func sameAsHandler(t *testing.T, s *simulate.ZoneConfig, z *zone) {
	t.Helper()
	m := s.Model()
	keys := func(d *identity.Deriver) (out []string) {
		for _, c := range d.Candidates() {
			out = append(out, c.String())
		}
		return out
	}
	costFrom := func(c *identity.Candidate) string {
		if c == nil {
			return ""
		}
		return c.String()
	}
	window := z.limit.Window
	if z.limit.Algorithm == algorithms.Concurrency {
		window = 0
	}
	for _, c := range []struct {
		field     string
		sim, hand any
	}{
		{"limit", m.Limit, z.limit},
		{"key", keys(m.Deriver), keys(z.deriver)},
		{"prefixes", fmtPrefixes(m.Deriver), fmtPrefixes(z.deriver)},
		{"cost", m.Cost, z.cost},
		{"cost placeholder", costFrom(m.CostFrom), costFrom(z.costExpr)},
		{"fail", m.Fail, z.fail},
		{"report_only", m.ReportOnly, z.reportOnly},
		{"dynamic", m.DynamicSpec, z.dynSpec},
		{"local_allowance", m.Allowance != nil, z.allowance != nil},
		// What the report shows.
		{"report algorithm", s.Algorithm, z.limit.Algorithm.String()},
		{"report events", s.Events, z.limit.Events},
		{"report window_ms", s.WindowMs, window},
		{"report burst", s.Burst, z.limit.Burst},
		{"report key", s.Key, keys(z.deriver)},
		{"report report_only", s.ReportOnly, z.reportOnly},
		{"report dynamic", s.Dynamic, z.dyn != nil},
		{"report concurrent", s.Concurrent > 0, z.conc != nil || z.adapt != nil},
	} {
		sj, _ := json.Marshal(c.sim)
		hj, _ := json.Marshal(c.hand)
		if string(sj) != string(hj) {
			t.Errorf("zone %q: %s: simulator %s, handler %s", z.name, c.field, sj, hj)
		}
	}
	if m.Allowance != nil && *m.Allowance != *z.allowance {
		t.Errorf("zone %q: local_allowance: simulator %+v, handler %+v", z.name, *m.Allowance, *z.allowance)
	}
}

func fmtPrefixes(d *identity.Deriver) [2]int {
	v4, v6 := d.Prefixes()
	return [2]int{v4, v6}
}

// rateLimitHandlers returns every rate_limit handler object in a config.
func rateLimitHandlers(v any) []json.RawMessage {
	var out []json.RawMessage
	switch v := v.(type) {
	case map[string]any:
		if v["handler"] == "rate_limit" {
			b, _ := json.Marshal(v)
			return []json.RawMessage{b}
		}
		for _, e := range v {
			out = append(out, rateLimitHandlers(e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, rateLimitHandlers(e)...)
		}
	}
	return out
}

// TestZoneModelDefaults: the defaults the zone model fills in, as the
// simulator reports them for a zone that sets none of them.
func TestZoneModelDefaults(t *testing.T) {
	js, err := adapt(t, modelCoverage)
	if err != nil {
		t.Fatal(err)
	}
	e, err := simulate.NewEngine(js, simulate.EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	got := map[string]*simulate.ZoneConfig{}
	for _, z := range e.Zones() {
		got[z.Name] = z
	}
	bare, slots, dry, down := got["bare"], got["slots"], got["dry"], got["down"]
	if bare == nil || slots == nil || dry == nil || down == nil {
		t.Fatalf("zones %v", got)
	}
	if v4, v6 := bare.Model().Deriver.Prefixes(); !slices.Equal(bare.Key, []string{zonemodel.DefaultKey}) || bare.Algorithm != "token_bucket" ||
		v4 != 32 || v6 != 64 || bare.Model().Fail != "open" || bare.Model().Cost != 1 || !bare.Enabled {
		t.Errorf("bare zone: %+v, prefixes /%d /%d, fail %q, cost %d", *bare, v4, v6, bare.Model().Fail, bare.Model().Cost)
	}
	if slots.Concurrent != 4 || slots.Algorithm != "concurrency" || slots.WindowMs != 0 || slots.Model().Limit.Window != 60_000 {
		t.Errorf("concurrency zone: %+v, lease %dms", *slots, slots.Model().Limit.Window)
	}
	if !dry.ReportOnly || down.Enabled || got["off"].Enabled {
		t.Errorf("report_only from the directive %v, switched-off directive %v, switched-off zone %v", dry.ReportOnly, down.Enabled, got["off"].Enabled)
	}
}
