package simulate

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/stores"
)

// KeyOverride is one override of a replay (--overrides <file>): a key's
// limit set at runtime through the admin API, in force while the traffic
// is replayed (docs/simulate.md, "Overrides"). The file is JSON:
// {"overrides": [KeyOverride, ...]}, the fields the admin API's PUT takes
// plus the zone, the key (raw, or a token) and until.
type KeyOverride struct {
	Zone      string `json:"zone"`
	Key       string `json:"key,omitempty"`
	Token     string `json:"token,omitempty"`
	Events    int64  `json:"events,omitempty"`
	Window    string `json:"window,omitempty"`
	Burst     int64  `json:"burst,omitempty"`
	Block     bool   `json:"block,omitempty"`
	Unlimited bool   `json:"unlimited,omitempty"`
	// Until ends it (RFC 3339, on the traffic's clock); default: never
	// during the replay.
	Until  string `json:"until,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// LoadKeyOverrides reads a file of overrides.
func LoadKeyOverrides(path string) ([]KeyOverride, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--overrides: %w", err)
	}
	var f struct {
		Overrides []KeyOverride `json:"overrides"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("--overrides %s: %w", path, err)
	}
	return f.Overrides, nil
}

// applyOverrides sets the overrides in the engine's store, checked as the
// admin API checks them.
func (e *Engine) applyOverrides(ovs []KeyOverride) error {
	for i, ko := range ovs {
		where := fmt.Sprintf("--overrides: override %d (zone %q)", i+1, ko.Zone)
		var zc *ZoneConfig
		for _, z := range e.rw.zones {
			if z.Name == ko.Zone {
				zc = z
			}
		}
		if zc == nil || zc.model == nil {
			return fmt.Errorf("%s: no such zone in the config", where)
		}
		m := zc.model
		o := algorithms.Override{Events: ko.Events, Burst: ko.Burst, Block: ko.Block, Unlimited: ko.Unlimited, Expires: math.MaxInt64 / 2}
		if ko.Window != "" {
			d, err := caddy.ParseDuration(ko.Window)
			if err != nil || d < time.Millisecond {
				return fmt.Errorf("%s: window %q: want a duration of at least 1ms", where, ko.Window)
			}
			o.Window = d.Milliseconds()
		}
		if ko.Until != "" {
			t, err := time.Parse(time.RFC3339, ko.Until)
			if err != nil {
				return fmt.Errorf("%s: until %q: want an RFC 3339 instant", where, ko.Until)
			}
			o.Expires = t.UnixMilli()
		}
		if err := o.Check(m.Limit, math.MinInt64/2); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		var toks []identity.Token
		switch {
		case ko.Token != "":
			tok, ok := identity.ParseToken(ko.Token)
			if !ok {
				return fmt.Errorf("%s: malformed token %q", where, ko.Token)
			}
			toks = append(toks, tok)
		case ko.Key != "":
			for c := range m.Deriver.Candidates() {
				if tok, ok := m.Deriver.TokenFor(c, ko.Key); ok {
					toks = append(toks, tok)
				}
			}
		}
		if len(toks) == 0 {
			return fmt.Errorf("%s: give a key the zone's candidates can render, or a token", where)
		}
		for _, tok := range toks {
			err := e.run.mem.SetOverride(context.Background(), ko.Zone, stores.OverrideEntry{Key: tok, Override: o, Reason: ko.Reason, By: "simulate"}, math.MaxInt)
			if err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
	}
	return nil
}
