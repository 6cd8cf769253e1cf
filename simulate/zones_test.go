package simulate_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/caddy-sluice/simulate"
)

// zoneJSON is a config of one rate_limit handler with the given zones.
func zoneJSON(zones string) []byte {
	return []byte(`{"apps":{"http":{"servers":{"s":{"listen":[":8080"],"routes":[{"handle":[` +
		`{"handler":"rate_limit","rate_limits":{` + zones + `}},{"handler":"static_response"}]}]}}}}}`)
}

// TestZonesReadAsTheHandlerReadsThem: the simulator reads a zone's JSON as
// the handler does (the zone model): a single key string, a window written
// as a duration string or as nanoseconds, a numeric cost, and a zone that
// sets nothing else gets the defaults.
func TestZonesReadAsTheHandlerReadsThem(t *testing.T) {
	e, err := simulate.NewEngine(zoneJSON(`"a":{"key":"{http.request.header.X-User}","max_events":5,"window":"1m","cost":2},`+
		`"b":{"max_events":7,"window":1500000000,"burst":9,"algorithm":"gcra"}`), simulate.EngineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	got := map[string]simulate.ZoneConfig{}
	for _, z := range e.Zones() {
		got[z.Name] = *z
	}
	a, b := got["a"], got["b"]
	if strings.Join(a.Key, ",") != "{http.request.header.X-User}" || a.WindowMs != 60_000 || a.Cost != "2" || a.Model().Cost != 2 || a.Algorithm != "token_bucket" {
		t.Errorf("zone a: %+v (cost %d)", a, a.Model().Cost)
	}
	if strings.Join(b.Key, ",") != "{http.vars.client_ip}" || b.WindowMs != 1500 || b.Burst != 9 || b.Algorithm != "gcra" || !b.Enabled {
		t.Errorf("zone b: %+v", b)
	}
}

// TestInvalidZoneIsTheHandlersError: a zone the model refuses fails the
// load with the handler's own error, named by Caddy's load as for any
// module.
func TestInvalidZoneIsTheHandlersError(t *testing.T) {
	for _, c := range []struct{ zones, want string }{
		{`"z":{"max_events":5,"window":"1500us"}`, `provision http.handlers.rate_limit: zone "z": window must be a whole number of milliseconds`},
		{`"z":{"max_events":5,"window":"1m","bogus":1}`, `http.handlers.rate_limit: json: unknown field "bogus"`},
	} {
		_, err := simulate.NewEngine(zoneJSON(c.zones), simulate.EngineOptions{})
		if err == nil || !strings.HasPrefix(err.Error(), "loading the config: loading http app module: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want Caddy's load naming %q", c.zones, err, c.want)
		}
	}
}
