package simulate

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
)

// ZoneConfig is what the simulator knows of one zone from the configuration
// (the handler decides with its own compiled form; this is for the report,
// the traffic sources and --compare).
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
}

// Capacity is what the zone's key can spend at once.
func (z *ZoneConfig) Capacity() int64 {
	if z.Burst > 0 {
		return z.Burst
	}
	return z.Events
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

// zonesOf records a rate_limit handler's zones and applies the overrides.
func (rw *rewritten) zonesOf(h map[string]any, ov Overrides, zones map[string]*ZoneConfig) error {
	hReport, _ := h["report_only"].(bool)
	hEnabled := true
	if e, ok := h["enabled"].(bool); ok {
		hEnabled = e
	}
	rls, _ := h["rate_limits"].(map[string]any)
	for name, raw := range rls {
		zm, ok := raw.(map[string]any)
		if !ok {
			continue
		}
		if name == ov.Zone && ov.Algorithm != "" {
			zm["algorithm"] = ov.Algorithm
			alg, err := algorithms.ParseAlgorithm(ov.Algorithm)
			if err != nil {
				return err
			}
			if !alg.AllowsBurst() {
				delete(zm, "burst")
				delete(zm, "burst_from")
			}
		}
		zc := &ZoneConfig{Name: name, Enabled: hEnabled, ReportOnly: hReport}
		zc.Algorithm, _ = zm["algorithm"].(string)
		if zc.Algorithm == "" {
			zc.Algorithm = algorithms.TokenBucket.String()
		}
		zc.Events = jsonInt(zm["max_events"])
		zc.WindowMs = jsonInt(zm["window"]) / 1e6
		zc.Burst = jsonInt(zm["burst"])
		if n := jsonInt(zm["concurrent"]); n != 0 {
			zc.Algorithm, zc.Concurrent, zc.Events = algorithms.Concurrency.String(), n, n
		}
		switch k := zm["key"].(type) {
		case string:
			zc.Key = []string{k}
		case []any:
			for _, e := range k {
				if s, ok := e.(string); ok {
					zc.Key = append(zc.Key, s)
				}
			}
		}
		if len(zc.Key) == 0 {
			zc.Key = []string{"{http.vars.client_ip}"}
		}
		switch c := zm["cost"].(type) {
		case string:
			zc.Cost = c
		case float64:
			zc.Cost = fmt.Sprint(int64(c))
		}
		if r, ok := zm["report_only"].(bool); ok && r {
			zc.ReportOnly = true
		}
		if e, ok := zm["enabled"].(bool); ok && !e {
			zc.Enabled = false
		}
		for _, f := range []string{"max_events_from", "window_from", "burst_from", "concurrent_from"} {
			if s, _ := zm[f].(string); s != "" {
				zc.Dynamic = true
			}
		}
		if old := zones[name]; old != nil {
			old.Enabled = old.Enabled || zc.Enabled
			continue
		}
		zones[name] = zc
	}
	return nil
}

// jsonInt reads a JSON number (or a Go duration string, for window) as an
// int64.
func jsonInt(v any) int64 {
	switch v := v.(type) {
	case float64:
		return int64(v)
	case string:
		if d, err := parseDuration(v); err == nil {
			return int64(d)
		}
	}
	return 0
}

// placeholders returns the placeholders (without braces) of every key
// candidate of the zone, in order.
func (z *ZoneConfig) placeholders() []string {
	var out []string
	for _, k := range z.Key {
		c, err := identity.Compile(k)
		if err != nil {
			continue
		}
		out = append(out, c.Placeholders()...)
	}
	return out
}

// costPlaceholders returns the placeholders of a per-request cost.
func (z *ZoneConfig) costPlaceholders() []string {
	if !strings.Contains(z.Cost, "{") {
		return nil
	}
	c, err := identity.Compile(z.Cost)
	if err != nil {
		return nil
	}
	return c.Placeholders()
}
