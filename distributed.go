package sluice

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// Distributed is caddy-ratelimit's distributed block, read as Sluice's
// asynchronous mode (Zone.Sync) for every zone of the directive, which
// must then have a Redis store (docs/migrating.md): one sync every
// min(ReadInterval, WriteInterval) sends this instance's charges and reads
// the counts back; a zone that names no algorithm counts as a
// sliding_window (caddy-ratelimit's own is a sliding window).
type Distributed struct {
	// WriteInterval is how often caddy-ratelimit wrote this instance's
	// state; with ReadInterval, it sets the sync interval. Default: 5s.
	WriteInterval caddy.Duration `json:"write_interval,omitempty"`

	// ReadInterval is how often caddy-ratelimit read the other instances'
	// states. Default: 5s.
	ReadInterval caddy.Duration `json:"read_interval,omitempty"`

	// PurgeAge is how long caddy-ratelimit kept a stopped instance's state
	// in storage: accepted and unused (a Redis key expires with its
	// window).
	PurgeAge caddy.Duration `json:"purge_age,omitempty"`

	at *caddyfile.Token // where the Caddyfile wrote it; nil from JSON
}

// caddy-ratelimit's defaults.
const defaultDistributedInterval = 5 * time.Second

// interval is the sync interval the block maps to.
func (d *Distributed) interval() time.Duration {
	r, w := time.Duration(d.ReadInterval), time.Duration(d.WriteInterval)
	if r == 0 {
		r = defaultDistributedInterval
	}
	if w == 0 {
		w = defaultDistributedInterval
	}
	return min(r, w)
}

// errDistributedStore is the refusal of distributed without a Redis store.
var errDistributedStore = errors.New("distributed: caddy-ratelimit's distributed block maps onto Sluice's asynchronous mode (zone sync), which shares counts through Redis, not Caddy storage: add `store redis { url ... }` to the directive (or the global rate_limit option), or remove distributed")

// applyDistributed puts every zone without a sync setting in the mode the
// block maps to. It runs where the store is known (parseCaddyfile,
// Provision) and again harmlessly.
func (h *Handler) applyDistributed() {
	if h.Distributed == nil {
		return
	}
	for _, z := range h.RateLimits {
		if z == nil || z.Sync != nil {
			continue
		}
		if z.Algorithm == "" && !z.IsConcurrency() {
			z.Algorithm = algorithms.SlidingWindow.String()
		}
		z.Sync = &zonemodel.Sync{Interval: caddy.Duration(h.Distributed.interval())}
	}
}

// checkDistributed refuses distributed unless the store (raw, its JSON) is
// Redis's; from a Caddyfile, the error names distributed's file and line.
func (h *Handler) checkDistributed(raw json.RawMessage) error {
	if h.Distributed == nil {
		return nil
	}
	var m struct {
		Module string `json:"module"`
	}
	if raw != nil && json.Unmarshal(raw, &m) == nil && m.Module == "redis" {
		return nil
	}
	if at := h.Distributed.at; at != nil {
		d := caddyfile.NewDispenser([]caddyfile.Token{*at})
		d.Next()
		return d.WrapErr(errDistributedStore)
	}
	return errDistributedStore
}

// validateDistributed checks the block's values.
func (d *Distributed) validate() error {
	if d == nil {
		return nil
	}
	if d.ReadInterval < 0 || d.WriteInterval < 0 || d.PurgeAge < 0 {
		return errors.New("distributed: read_interval, write_interval and purge_age must be positive durations")
	}
	if i := d.interval(); i < zonemodel.MinSyncInterval || i > zonemodel.MaxSyncInterval {
		return fmt.Errorf("distributed: the sync interval, the lesser of read_interval and write_interval, must be between %s and %s, got %s", zonemodel.MinSyncInterval, zonemodel.MaxSyncInterval, i)
	}
	return nil
}

// parseDistributed parses `distributed { read_interval write_interval
// purge_age }`.
func parseDistributed(d *caddyfile.Dispenser) (*Distributed, error) {
	if d.NextArg() {
		return nil, d.Errf("rate_limit: distributed takes a block, not %q", d.Val())
	}
	tok := d.Token()
	out := &Distributed{at: &tok}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		var dst *caddy.Duration
		switch field {
		case "read_interval":
			dst = &out.ReadInterval
		case "write_interval":
			dst = &out.WriteInterval
		case "purge_age":
			dst = &out.PurgeAge
		default:
			return nil, d.Errf("rate_limit: distributed: unknown option %q (known: read_interval, write_interval, purge_age)", field)
		}
		v, err := oneArg(d, "rate_limit: distributed: "+field)
		if err != nil {
			return nil, err
		}
		dur, err := caddy.ParseDuration(v)
		if err != nil || dur <= 0 {
			return nil, d.Errf("rate_limit: distributed: %s must be a positive duration, got %q", field, v)
		}
		*dst = caddy.Duration(dur)
	}
	return out, nil
}
