package simulate

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// ZoneConfig is what the simulator reports of one zone: its compiled model
// (zonemodel, the handler's own) as the report shows it. The handler decides
// with its runtime form of the same model; this is for the report, the
// traffic sources and --compare.
type ZoneConfig struct {
	Name       string   `json:"name"`
	Algorithm  string   `json:"algorithm"`
	Events     int64    `json:"events"`
	WindowMs   int64    `json:"window_ms"`
	Burst      int64    `json:"burst,omitempty"`
	Key        []string `json:"key"`
	Cost       string   `json:"cost,omitempty"`
	ReportOnly bool     `json:"report_only"`
	Enabled    bool     `json:"enabled"`
	// Dynamic: the limit is chosen per request (max_events_from and co.).
	Dynamic bool `json:"dynamic,omitempty"`
	// Concurrent is a concurrency zone's slots (its Algorithm is then
	// "concurrency", Events the slots too and WindowMs 0); 0 for a rate
	// zone.
	Concurrent int64 `json:"concurrent,omitempty"`

	model *zonemodel.Compiled
}

// Model returns the zone's compiled model, as the handler compiles it.
func (z *ZoneConfig) Model() *zonemodel.Compiled { return z.model }

// zoneConfigOf is the report's view of a compiled zone; enabled is the
// directive's switch.
func zoneConfigOf(m *zonemodel.Compiled, cost string, enabled bool) *ZoneConfig {
	zc := &ZoneConfig{Name: m.Name, Algorithm: m.Limit.Algorithm.String(), Events: m.Limit.Events,
		WindowMs: m.Limit.Window, Burst: m.Limit.Burst, Cost: cost, ReportOnly: m.ReportOnly,
		Enabled: enabled && m.Enabled, Dynamic: m.Dynamic(), Concurrent: m.Concurrent(), model: m}
	if zc.Concurrent > 0 {
		zc.WindowMs = 0 // the limit's window is the slots' lease
	}
	if m.Deriver != nil {
		for _, c := range m.Deriver.Candidates() {
			zc.Key = append(zc.Key, c.String())
		}
	}
	return zc
}

// rewritten is a configuration prepared for the simulator.
type rewritten struct {
	json  []byte
	zones []*ZoneConfig // by name
	// replaced counts the handlers replaced, by kind, for the report.
	replaced map[string]int
	// untouched lists third-party handlers left as they are.
	untouched []string
	// hasAuth: an authentication handler was replaced by the simulated one.
	hasAuth bool
	// invalid is the first zone that the zone model refuses; the handler
	// refuses it too, when Caddy loads the config.
	invalid error
	// hosts lists, per server, the hosts its top-level routes match, in
	// order (read here: provisioning drops the routes' raw matchers).
	hosts map[string][]string
}

// handlers that are safe to run as configured: they neither reach the
// network nor depend on what is on disk beyond the config.
var safeHandlers = []string{
	"rate_limit", "static_response", upstreamHandlerName, "subroute", "vars", "map", "headers", "request_header",
	"rewrite", "encode", "templates", "error", "request_body", "invoke", "log_append", "log_filter",
	"intercept", "copy_response", "copy_response_headers", "metrics", "push", "trace", "acme_server",
}

// Overrides change zones of the configuration before it is loaded (for
// --compare).
type Overrides struct {
	// Algorithm sets this zone's algorithm ("" leaves it).
	Zone, Algorithm string
}

// rewrite prepares a Caddy JSON configuration for the simulator:
//
//   - only the http app is kept (no admin endpoint, no tls, events or other
//     apps: nothing starts, listens or runs event handlers), with file
//     system storage kept and any other storage dropped;
//   - logging goes to stderr at level ERROR, and the servers' access logs
//     are off (the simulation must not write to the production logs);
//   - terminal handlers that reach the network or the disk are replaced:
//     reverse_proxy (also php_fastcgi's) and file_server by the simulator's
//     upstream, which answers with the logged status (200 without one),
//     a reverse_proxy with handle_response routes (forward_auth) by a
//     pass-through, tracing by a pass-through, and authentication by the
//     simulator's, which sets {http.auth.user.id} from the traffic (the
//     access log's user_id) and refuses with 401 without one;
//   - every rate_limit handler uses the simulator's store (the memory
//     store on the virtual clock, recording every decision) and no metrics.
func rewrite(cfgJSON []byte, runID string, ov Overrides) (*rewritten, error) {
	var cfg map[string]any
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		return nil, fmt.Errorf("decoding the JSON config: %w", err)
	}
	apps, _ := cfg["apps"].(map[string]any)
	httpApp, _ := apps["http"].(map[string]any)
	if httpApp == nil {
		return nil, fmt.Errorf("the config has no http app: nothing to simulate")
	}
	out := map[string]any{
		"apps": map[string]any{"http": httpApp},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{
			"level":  "ERROR",
			"writer": map[string]any{"output": "stderr"},
		}}},
	}
	if st, ok := cfg["storage"].(map[string]any); ok && st["module"] == "file_system" {
		out["storage"] = st
	}
	rw := &rewritten{replaced: map[string]int{}, hosts: map[string][]string{}}
	zones := map[string]*ZoneConfig{}
	servers, _ := httpApp["servers"].(map[string]any)
	if len(servers) == 0 {
		return nil, fmt.Errorf("the config's http app has no servers: nothing to simulate")
	}
	for name, s := range servers {
		srv, ok := s.(map[string]any)
		if !ok {
			continue
		}
		rw.hosts[name] = routeHosts(srv)
		delete(srv, "logs")
		if err := rw.walk(srv, runID, ov, zones); err != nil {
			return nil, err
		}
	}
	if len(zones) == 0 {
		return nil, fmt.Errorf("the config has no rate_limit zone: nothing to simulate")
	}
	if ov.Zone != "" && zones[ov.Zone] == nil {
		return nil, fmt.Errorf("zone %q: no such zone in the config (zones: %s)", ov.Zone, strings.Join(zoneNames(zones), ", "))
	}
	for _, n := range zoneNames(zones) {
		rw.zones = append(rw.zones, zones[n])
	}
	slices.Sort(rw.untouched)
	rw.untouched = slices.Compact(rw.untouched)
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	rw.json = b
	return rw, nil
}

// routeHosts returns the hosts that a server's top-level routes match (a
// site's addresses), in order, without duplicates or placeholders.
func routeHosts(srv map[string]any) []string {
	var out []string
	routes, _ := srv["routes"].([]any)
	for _, rt := range routes {
		r, _ := rt.(map[string]any)
		sets, _ := r["match"].([]any)
		for _, set := range sets {
			m, _ := set.(map[string]any)
			hosts, _ := m["host"].([]any)
			for _, h := range hosts {
				if h, ok := h.(string); ok && h != "" && !strings.Contains(h, "{") && !slices.Contains(out, h) {
					out = append(out, h)
				}
			}
		}
	}
	return out
}

func zoneNames(m map[string]*ZoneConfig) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// walk rewrites the handlers found anywhere under v (routes, subroutes,
// error routes, named routes, handle_response routes).
func (rw *rewritten) walk(v any, runID string, ov Overrides, zones map[string]*ZoneConfig) error {
	switch v := v.(type) {
	case []any:
		for i, e := range v {
			if m, ok := e.(map[string]any); ok {
				if h, ok := m["handler"].(string); ok {
					repl, err := rw.handler(h, m, runID, ov, zones)
					if err != nil {
						return err
					}
					if repl != nil {
						v[i] = repl
						continue
					}
				}
			}
			if err := rw.walk(e, runID, ov, zones); err != nil {
				return err
			}
		}
	case map[string]any:
		for _, e := range v {
			if err := rw.walk(e, runID, ov, zones); err != nil {
				return err
			}
		}
	}
	return nil
}

// handler rewrites one handler object; a non-nil result replaces it.
func (rw *rewritten) handler(name string, m map[string]any, runID string, ov Overrides, zones map[string]*ZoneConfig) (map[string]any, error) {
	switch name {
	case "rate_limit":
		m["store"] = map[string]any{"module": storeModuleName, "run": runID}
		m["disable_metrics"] = true
		delete(m, "sweep_interval") // configures the default memory store, replaced
		rw.unsync(m)
		return nil, rw.zonesOf(m, ov, zones)
	case "reverse_proxy":
		if hr, ok := m["handle_response"].([]any); ok && len(hr) > 0 {
			rw.replaced["forward_auth (reverse_proxy with handle_response): passed through"]++
			return map[string]any{"handler": "vars"}, nil
		}
		rw.replaced["reverse_proxy: the logged status (200 without one)"]++
		return map[string]any{"handler": upstreamHandlerName}, nil
	case "file_server":
		rw.replaced["file_server: the logged status (200 without one)"]++
		return map[string]any{"handler": upstreamHandlerName}, nil
	case "tracing":
		rw.replaced["tracing: passed through"]++
		return map[string]any{"handler": "vars"}, nil
	case "authentication":
		rw.replaced["authentication: user id from the traffic"]++
		rw.hasAuth = true
		return map[string]any{"handler": authHandlerName}, nil
	}
	if !slices.Contains(safeHandlers, name) {
		rw.untouched = append(rw.untouched, name)
	}
	return nil, nil
}

// directive is what the simulator reads of a rate_limit handler: its zones,
// in the zone model, and the two switches that apply to all of them.
type directive struct {
	RateLimits map[string]json.RawMessage `json:"rate_limits"`
	ReportOnly bool                       `json:"report_only"`
	Enabled    *bool                      `json:"enabled"`
}

// zonesOf records a rate_limit handler's zones, compiled by the zone model
// as the handler compiles them, and applies the overrides. A zone the model
// refuses is recorded by its name only: loading the config then fails with
// the handler's own error for it.
func (rw *rewritten) zonesOf(h map[string]any, ov Overrides, zones map[string]*ZoneConfig) error {
	var d directive
	b, err := json.Marshal(h)
	if err == nil {
		// A field of the wrong type is left out, the others read: Caddy's
		// load refuses the handler for it.
		err = json.Unmarshal(b, &d)
	}
	rw.invalid = cmp.Or(rw.invalid, err)
	for name, raw := range d.RateLimits {
		if len(raw) == 0 || raw[0] != '{' {
			continue
		}
		cfg := new(zonemodel.Zone)
		err := json.Unmarshal(raw, cfg)
		if err == nil && name == ov.Zone && ov.Algorithm != "" {
			alg, err := algorithms.ParseAlgorithm(ov.Algorithm)
			if err != nil {
				return err
			}
			cfg.Algorithm = ov.Algorithm
			if !alg.AllowsBurst() {
				cfg.Burst, cfg.BurstFrom = 0, ""
			}
			h["rate_limits"].(map[string]any)[name] = cfg
		}
		var m *zonemodel.Compiled
		if err == nil {
			c := *cfg // the config handed to Caddy keeps its own defaults
			c.SetDefaults()
			c.ReportOnly = c.ReportOnly || d.ReportOnly
			m, err = c.Compile(name)
		}
		if err != nil {
			rw.invalid = cmp.Or(rw.invalid, fmt.Errorf("zone %q: %w", name, err))
			m = &zonemodel.Compiled{Name: name}
		}
		zc := zoneConfigOf(m, string(cfg.Cost), d.Enabled == nil || *d.Enabled)
		if old := zones[name]; old != nil {
			old.Enabled = old.Enabled || zc.Enabled
			continue
		}
		zones[name] = zc
	}
	return nil
}

// placeholders returns the placeholders (without braces) of every key
// candidate of the zone, in order.
func (z *ZoneConfig) placeholders() []string {
	if z.model.Deriver == nil {
		return nil
	}
	var out []string
	for _, c := range z.model.Deriver.Candidates() {
		out = append(out, c.Placeholders()...)
	}
	return out
}

// costPlaceholders returns the placeholders of a per-request cost.
func (z *ZoneConfig) costPlaceholders() []string {
	if z.model.CostFrom == nil {
		return nil
	}
	return z.model.CostFrom.Placeholders()
}

// syncNote is the note of a replay with zones in the asynchronous mode.
const syncNote = "sync (asynchronous mode): replayed as one instance, exact; across I instances a key may admit up to N + (I-1)(N-G) per window (docs/redis.md)"

// unsync replays the zones in the asynchronous mode (sync, or the
// directive's distributed block) as exact zones: one process is one
// instance, for which the mode is exact. distributed's mapping of a zone
// without algorithm to sliding_window is kept.
func (rw *rewritten) unsync(m map[string]any) {
	_, distributed := m["distributed"]
	delete(m, "distributed")
	zs, _ := m["rate_limits"].(map[string]any)
	for _, z := range zs {
		zm, ok := z.(map[string]any)
		if !ok {
			continue
		}
		if _, ok := zm["sync"]; ok || distributed {
			if _, ok := zm["algorithm"]; !ok && distributed {
				zm["algorithm"] = "sliding_window"
			}
			delete(zm, "sync")
			rw.replaced[syncNote]++
		}
	}
}
