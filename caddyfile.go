package sluice

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/reply"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
	httpcaddyfile.RegisterGlobalOption("rate_limit", parseGlobalOption)
}

// globalOptions is the value of the `rate_limit` global option: defaults for
// every rate_limit directive of the Caddyfile.
type globalOptions struct {
	storeRaw []byte
}

// parseGlobalOption parses the global option:
//
//	{
//	    rate_limit {
//	        store <name> { ... }
//	    }
//	}
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	opts, _ := existing.(*globalOptions)
	if opts == nil {
		opts = new(globalOptions)
	}
	d.Next() // the option's name
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "store":
			if opts.storeRaw != nil {
				return nil, d.Err("rate_limit global option: duplicate store")
			}
			raw, err := parseStore(d)
			if err != nil {
				return nil, err
			}
			opts.storeRaw = raw
		default:
			return nil, d.Errf("rate_limit global option: unknown option %q (known: store)", d.Val())
		}
	}
	return opts, nil
}

// parseCaddyfile sets up the handler from a rate_limit directive and
// applies the global option's defaults.
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	handler := new(Handler)
	if err := handler.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	if handler.StoreRaw == nil {
		if opts, ok := h.Option("rate_limit").(*globalOptions); ok && opts.storeRaw != nil {
			handler.StoreRaw = opts.storeRaw
		}
	}
	return handler, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens: the
// rate_limit directive, whose grammar is docs/reference.md's "The grammar at
// a glance" (docs_test.go holds that page to this parser).
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	at := &fieldPlaces{block: d.Token(), fields: map[string]caddyfile.Token{}}
	if d.NextArg() {
		return d.Errf("rate_limit: unexpected argument %q (a matcher goes right after rate_limit; settings go in the block)", d.Val())
	}
	p := directiveParser{d}
	places := map[string]*fieldPlaces{} // where each zone and its fields were written
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		if seen[field] && field != "zone" {
			return d.Errf("rate_limit: duplicate %s", field)
		}
		seen[field] = true
		at.fields[field] = d.Token()
		var err error
		switch field {
		case "zone":
			err = h.parseZoneInto(d, places)
		case "store":
			h.StoreRaw, err = parseStore(d)
		case "headers":
			h.Headers, err = p.arg(field)
		case "grpc_status":
			h.GRPCStatus, err = p.arg(field)
		case "response":
			h.Response, err = reply.ParseResponse(d)
		case "jitter":
			h.Jitter, err = p.jitter()
		case "report_only":
			h.ReportOnly, err = p.flag(field)
		case "log_key":
			h.LogKey, err = p.flag(field)
		case "disable_metrics":
			h.DisableMetrics, err = p.flag(field)
		case "enabled":
			h.Enabled, err = p.enabled()
		case "max_waiting":
			h.MaxWaiting, err = p.maxWaiting()
		case "settle_wait":
			h.SettleWait, err = p.settleWait()
		case "sweep_interval":
			h.SweepInterval, err = p.sweepInterval()
		case "distributed":
			return d.Err("rate_limit: distributed is not supported: Sluice shares exact state through a shared store instead of synchronising through Caddy storage; use `store redis { url ... }`")
		case "storage":
			return d.Err("rate_limit: storage is not supported: Sluice keeps rate limit state in its own store; use `store memory` (the default) or `store redis { url ... }`")
		default:
			return d.Errf("rate_limit: unknown subdirective %q (known: zone, store, headers, response, jitter, log_key, report_only, enabled, sweep_interval, disable_metrics, max_waiting, settle_wait, grpc_status)", field)
		}
		if err != nil {
			return err
		}
	}
	return h.checkParsed(at, places)
}

// directiveParser reads the values of the rate_limit directive's own
// subdirectives; its errors name the file and line.
type directiveParser struct{ d *caddyfile.Dispenser }

// arg reads the field's one argument.
func (p directiveParser) arg(field string) (string, error) {
	return oneArg(p.d, "rate_limit: "+field)
}

// flag reads a subdirective that takes no argument.
func (p directiveParser) flag(field string) (bool, error) {
	if p.d.NextArg() {
		return false, p.d.Errf("rate_limit: %s takes no argument, got %q", field, p.d.Val())
	}
	return true, nil
}

// jitter reads a fraction (0.2) or a percentage (20%).
func (p directiveParser) jitter() (float64, error) {
	v, err := p.arg("jitter")
	if err != nil {
		return 0, err
	}
	j, perr := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
	// NaN and ±Inf parse, but JSON cannot carry them: the handler would be
	// lost from the adapted config with a misleading error.
	if perr != nil || math.IsNaN(j) || math.IsInf(j, 0) {
		return 0, p.d.Errf("rate_limit: jitter must be a fraction (0.2) or a percentage (20%%), got %q", v)
	}
	if strings.HasSuffix(v, "%") {
		j /= 100
	}
	return j, nil
}

func (p directiveParser) enabled() (*bool, error) {
	v, err := p.arg("enabled")
	if err != nil {
		return nil, err
	}
	b, perr := strconv.ParseBool(v)
	if perr != nil {
		return nil, p.d.Errf("rate_limit: enabled must be true or false, got %q", v)
	}
	return &b, nil
}

func (p directiveParser) maxWaiting() (int, error) {
	v, err := p.arg("max_waiting")
	if err != nil {
		return 0, err
	}
	n, perr := strconv.Atoi(v)
	if perr != nil || n < 1 { // 0 would read as not set
		return 0, p.d.Errf("rate_limit: max_waiting must be a positive integer, got %q", v)
	}
	return n, nil
}

func (p directiveParser) settleWait() (*caddy.Duration, error) {
	v, err := p.arg("settle_wait")
	if err != nil {
		return nil, err
	}
	dur, perr := caddy.ParseDuration(v)
	if perr != nil {
		return nil, p.d.Errf("rate_limit: settle_wait must be a duration (0: no waiting), got %q", v)
	}
	sw := caddy.Duration(dur)
	return &sw, nil
}

func (p directiveParser) sweepInterval() (caddy.Duration, error) {
	v, err := p.arg("sweep_interval")
	if err != nil {
		return 0, err
	}
	dur, perr := caddy.ParseDuration(v)
	if perr != nil || dur <= 0 { // 0 would read as not set
		return 0, p.d.Errf("rate_limit: sweep_interval must be a positive duration, got %q", v)
	}
	return caddy.Duration(dur), nil
}

// checkParsed runs the load-time checks (compileZone, Handler.Validate) on
// the parsed directive, and names in an error the file and line of the
// field it is about.
func (h *Handler) checkParsed(at *fieldPlaces, places map[string]*fieldPlaces) error {
	for _, name := range slices.Sorted(maps.Keys(h.RateLimits)) {
		z := h.RateLimits[name]
		c := *z // compile needs the defaults, the adapted JSON leaves them out
		c.SetDefaults()
		c.ReportOnly = c.ReportOnly || h.ReportOnly
		_, err := compileZone(&c, name)
		if err == nil {
			one := &Handler{ReportOnly: h.ReportOnly, RateLimits: map[string]*Zone{name: z}}
			if err = one.validateZoneModes(); err != nil {
				err = errors.Unwrap(err) // named again below
			}
		}
		if err != nil {
			return places[name].wrap(zoneErr(name, err), err)
		}
	}
	if err := h.Validate(); err != nil {
		return at.wrap(fmt.Errorf("rate_limit: %w", err), err)
	}
	return nil
}

// fieldPlaces are where a block (a directive, a zone) and each of its
// fields were first written.
type fieldPlaces struct {
	block  caddyfile.Token
	fields map[string]caddyfile.Token
}

// fieldAliases are the Caddyfile fields that check errors name by their
// JSON names.
var fieldAliases = map[string]string{"max_events": "events", "max_events_from": "events",
	"window_from": "window", "burst_from": "burst", "cost_default": "cost", "concurrent_from": "concurrent"}

// wrap adds to err the file and line of the field that check, a check's
// error, is about: the checks name it first ("lease must be ..."). Else
// the block's.
func (p *fieldPlaces) wrap(err, check error) error {
	msg := check.Error()
	field := msg[:len(msg)-len(strings.TrimLeft(msg, "abcdefghijklmnopqrstuvwxyz0123456789_"))]
	if a, ok := fieldAliases[field]; ok {
		field = a
	}
	tok, ok := p.fields[field]
	if !ok {
		tok = p.block
	}
	d := caddyfile.NewDispenser([]caddyfile.Token{tok})
	d.Next()
	return d.WrapErr(err)
}

// parseZoneInto parses `zone <name> { ... }` into h.RateLimits. A zone
// repeated as it is, as caddy-ratelimit accepts it, is one zone; repeated
// with other settings, it is two limits for one bucket, refused naming both
// places (places: where each zone and its fields were defined).
func (h *Handler) parseZoneInto(d *caddyfile.Dispenser, places map[string]*fieldPlaces) error {
	if !d.NextArg() {
		return d.Err("rate_limit: zone needs a name")
	}
	name := d.Val()
	if d.NextArg() {
		return d.Errf("zone %q: unexpected argument %q", name, d.Val())
	}
	at := &fieldPlaces{block: d.Token(), fields: map[string]caddyfile.Token{}}
	z, err := zonemodel.ParseZone(d, name, at.fields)
	if err != nil {
		return err
	}
	if prev, dup := h.RateLimits[name]; dup {
		first := places[name].block
		if !sameZone(prev, z) {
			return fmt.Errorf("zone %q: defined at %s:%d and again, with other settings, at %s:%d; a zone name is one bucket with one limit (rename one of them)", name, first.File, first.Line, at.block.File, at.block.Line)
		}
		return nil
	}
	places[name] = at
	if h.RateLimits == nil {
		h.RateLimits = map[string]*Zone{}
	}
	h.RateLimits[name] = z
	return nil
}

// sameZone reports whether two zone configurations are the same, as their
// JSON says.
func sameZone(a, b *Zone) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// parseStore parses `store <name> { ... }` into the store module's JSON.
func parseStore(d *caddyfile.Dispenser) ([]byte, error) {
	if !d.NextArg() {
		return nil, d.Err("store needs a name (memory or redis)")
	}
	name := d.Val()
	modID := "http.handlers.rate_limit.stores." + name
	unm, err := caddyfile.UnmarshalModule(d, modID)
	if err != nil {
		// The stores name themselves in their errors ("store redis: ...",
		// with the file and line): prefixing those again would read
		// "store redis: store redis: ...".
		if strings.HasPrefix(err.Error(), "store "+name+":") {
			return nil, err
		}
		return nil, d.Errf("store %s: %v", name, err)
	}
	return caddyconfig.JSONModuleObject(unm, "module", name, nil), nil
}

// oneArg reads exactly one argument for what.
func oneArg(d *caddyfile.Dispenser, what string) (string, error) {
	if !d.NextArg() {
		return "", d.Errf("%s needs a value", what)
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.Errf("%s takes one value, got also %q", what, d.Val())
	}
	return v, nil
}
