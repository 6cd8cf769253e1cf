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
	arg := func(field string) (string, error) { return oneArg(d, "rate_limit: "+field) }
	flag := func(field string) (bool, error) {
		if d.NextArg() {
			return false, d.Errf("rate_limit: %s takes no argument, got %q", field, d.Val())
		}
		return true, nil
	}
	places := map[string]*fieldPlaces{} // where each zone and its fields were written
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		if seen[field] && field != "zone" {
			return d.Errf("rate_limit: duplicate %s", field)
		}
		seen[field] = true
		at.fields[field] = d.Token()
		var v string
		var err error
		switch field {
		case "zone":
			err = h.parseZoneInto(d, places)
		case "store":
			h.StoreRaw, err = parseStore(d)
		case "headers":
			h.Headers, err = arg(field)
		case "grpc_status":
			h.GRPCStatus, err = arg(field)
		case "response":
			h.Response, err = parseResponse(d)
		case "jitter":
			if v, err = arg(field); err != nil {
				break
			}
			j, perr := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
			// NaN and ±Inf parse, but JSON cannot carry them: the handler
			// would be lost from the adapted config with a misleading error.
			if perr != nil || math.IsNaN(j) || math.IsInf(j, 0) {
				return d.Errf("rate_limit: jitter must be a fraction (0.2) or a percentage (20%%), got %q", v)
			}
			if strings.HasSuffix(v, "%") {
				j /= 100
			}
			h.Jitter = j
		case "report_only":
			h.ReportOnly, err = flag(field)
		case "log_key":
			h.LogKey, err = flag(field)
		case "disable_metrics":
			h.DisableMetrics, err = flag(field)
		case "enabled":
			if v, err = arg(field); err != nil {
				break
			}
			b, perr := strconv.ParseBool(v)
			if perr != nil {
				return d.Errf("rate_limit: enabled must be true or false, got %q", v)
			}
			h.Enabled = &b
		case "max_waiting":
			if v, err = arg(field); err != nil {
				break
			}
			n, perr := strconv.Atoi(v)
			if perr != nil || n < 1 { // 0 would read as not set
				return d.Errf("rate_limit: max_waiting must be a positive integer, got %q", v)
			}
			h.MaxWaiting = n
		case "settle_wait":
			if v, err = arg(field); err != nil {
				break
			}
			dur, perr := caddy.ParseDuration(v)
			if perr != nil {
				return d.Errf("rate_limit: settle_wait must be a duration (0: no waiting), got %q", v)
			}
			sw := caddy.Duration(dur)
			h.SettleWait = &sw
		case "sweep_interval":
			if v, err = arg(field); err != nil {
				break
			}
			dur, perr := caddy.ParseDuration(v)
			if perr != nil || dur <= 0 { // 0 would read as not set
				return d.Errf("rate_limit: sweep_interval must be a positive duration, got %q", v)
			}
			h.SweepInterval = caddy.Duration(dur)
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
	z, err := parseZone(d, name, at.fields)
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

// parseZone parses a zone block; the dispenser is on the zone's name. at
// gets where each field was first written.
func parseZone(d *caddyfile.Dispenser, name string, at map[string]caddyfile.Token) (*Zone, error) {
	z := new(Zone)
	p := zoneParser{d, name}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		if seen[field] && field != "match" {
			return nil, p.errf("duplicate %s", field)
		}
		if !seen[field] {
			at[field] = d.Token()
		}
		seen[field] = true
		var v string
		var err error
		switch field {
		case "key":
			if z.Key = d.RemainingArgs(); len(z.Key) == 0 {
				return nil, p.errf("key needs at least one candidate, e.g. key {http.auth.user.id} {client_ip}")
			}
		case "events":
			if z.MaxEventsFrom, v, err = p.perRequest(field, "60"); err == nil {
				z.MaxEvents, err = p.count(field, v)
			}
		case "burst":
			if z.BurstFrom, v, err = p.perRequest(field, "20"); err == nil {
				z.Burst, err = p.count(field, v)
			}
		case "window":
			if z.WindowFrom, v, err = p.perRequest(field, "1m"); err == nil {
				z.Window, err = p.duration(field, v)
			}
		case "algorithm":
			z.Algorithm, err = p.arg(field)
		case "cost":
			args := d.RemainingArgs()
			switch {
			case len(args) == 0:
				return nil, p.errf("cost needs a value")
			case len(args) == 2 && strings.Contains(args[0], "{"):
				z.CostDefault, err = p.count("cost's default", args[1])
			case len(args) != 1:
				return nil, p.errf("cost takes an integer, or a placeholder and an optional default (cost {cost} 1), got %q", strings.Join(args, " "))
			}
			z.Cost = caddyhttp.WeakString(args[0])
		case "report_only":
			if d.NextArg() {
				return nil, p.errf("report_only takes no argument, got %q", d.Val())
			}
			z.ReportOnly = true
		case "enabled":
			if v, err = p.arg(field); err == nil {
				b, perr := strconv.ParseBool(v)
				if perr != nil {
					err = p.errf("enabled must be true or false, got %q", v)
				}
				z.Enabled = &b
			}
		case "fail":
			z.Fail, err = p.arg(field)
		case "match":
			if d.NextArg() {
				return nil, p.errf("match takes a block of matchers, not %q", d.Val())
			}
			set, perr := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if perr != nil {
				return nil, p.errf("match: %v", perr)
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
		case "local_allowance":
			z.LocalAllowance, err = p.localAllowance()
		case "ipv4_prefix":
			z.IPv4Prefix, err = p.prefix(field)
		case "ipv6_prefix":
			z.IPv6Prefix, err = p.prefix(field)
		case "count":
			if z.Count = d.RemainingArgs(); len(z.Count) == 0 {
				return nil, p.errf("count needs at least one status: a code, a class or a range (count 401 403, count 4xx, count 500-599)")
			}
		case "on_exceed":
			z.OnExceed, err = p.arg(field)
		case "settle":
			z.Settle, err = p.settle()
		case "penalty":
			if v, err = p.arg(field); err == nil {
				z.Penalty, err = p.duration(field, v)
			}
		case "delay":
			if v, err = p.arg(field); err == nil {
				z.Delay, err = p.duration(field, v)
			}
		case "max_overrides":
			if v, err = p.arg(field); err == nil {
				var n int64
				n, err = p.count(field, v)
				z.MaxOverrides = int(n)
			}
		case "delay_after":
			if v, err = p.arg(field); err == nil {
				z.DelayAfter, err = p.count(field, v)
			}
		case "concurrent":
			if d.NextArg() {
				if d.Val() == "adaptive" {
					if d.NextArg() {
						return nil, p.errf("concurrent adaptive takes a block of settings, not %q", d.Val())
					}
					z.Adaptive, err = p.adaptive()
					break
				}
				d.Prev()
			}
			if z.ConcurrentFrom, v, err = p.perRequest(field, "10"); err == nil {
				z.Concurrent, err = p.count(field, v)
			}
		case "lease":
			if v, err = p.arg(field); err == nil {
				z.Lease, err = p.duration(field, v)
			}
		default:
			return nil, p.errf("unknown subdirective %q (known: key, events, window, burst, algorithm, cost, match, ipv4_prefix, ipv6_prefix, fail, report_only, enabled, count, settle, on_exceed, penalty, delay, delay_after, concurrent, lease, local_allowance, max_overrides)", field)
		}
		if err != nil {
			return nil, err
		}
	}
	return z, nil
}

// adaptive parses the block of `concurrent adaptive { ... }` (none: every
// setting at its default); the dispenser is on "adaptive".
func (p zoneParser) adaptive() (*zonemodel.Adaptive, error) {
	a := new(zonemodel.Adaptive)
	seen := map[string]bool{}
	for nesting := p.d.Nesting(); p.d.NextBlock(nesting); {
		field := p.d.Val()
		if seen[field] {
			return nil, p.errf("concurrent adaptive: duplicate %s", field)
		}
		seen[field] = true
		v, err := p.arg("concurrent adaptive: " + field)
		if err != nil {
			return nil, err
		}
		switch field {
		case "controller":
			a.Controller = v
		case "minimum", "maximum", "initial":
			n, err := p.count("concurrent adaptive: "+field, v)
			if err != nil {
				return nil, err
			}
			*map[string]*int64{"minimum": &a.Minimum, "maximum": &a.Maximum, "initial": &a.Initial}[field] = n
		case "tolerance", "smoothing":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				return nil, p.errf("concurrent adaptive: %s must be a positive number, got %q", field, v)
			}
			*map[string]*float64{"tolerance": &a.Tolerance, "smoothing": &a.Smoothing}[field] = f
		case "window":
			if a.Window, err = p.duration("concurrent adaptive: window", v); err != nil {
				return nil, err
			}
		default:
			return nil, p.errf("concurrent adaptive: unknown setting %q (known: controller, minimum, maximum, initial, tolerance, smoothing, window)", field)
		}
	}
	return a, nil
}

// settle parses `settle header <name>` or `settle json <path>...`, and the
// optional block of settle's options.
func (p zoneParser) settle() (*Settle, error) {
	args := p.d.RemainingArgs()
	var s Settle
	switch {
	case len(args) == 2 && args[0] == "header":
		s.Header = args[1]
	case len(args) >= 2 && args[0] == "json":
		s.JSON = strings.Join(args[1:], " ")
	default:
		return nil, p.errf("settle takes a source: header <name> or json <path>... (settle json usage.total_tokens), got %q", strings.Join(args, " "))
	}
	seen := map[string]bool{}
	for nesting := p.d.Nesting(); p.d.NextBlock(nesting); {
		field := p.d.Val()
		if seen[field] {
			return nil, p.errf("settle: duplicate %s", field)
		}
		seen[field] = true
		ok, err := p.settleRequestOption(&s, field)
		if err != nil {
			return nil, err
		}
		if !ok {
			if err := p.settleOption(&s, field); err != nil {
				return nil, err
			}
		}
	}
	return &s, nil
}

// settleOption parses one option of settle's block.
func (p zoneParser) settleOption(s *Settle, field string) error {
	switch field {
	case "free":
		if s.Free = p.d.RemainingArgs(); len(s.Free) == 0 {
			return p.errf("settle: free needs the statuses whose estimate is given back (free 5xx 429), or none")
		}
		if _, err := parseStatuses("settle: free", s.FreeStatuses()); err != nil {
			return p.errf("%v", err)
		}
	default:
		return p.errf("settle: unknown option %q (known: free, unknown, ask_usage)", field)
	}
	return nil
}

// localAllowance parses `local_allowance [<max_batch> [<expiry>]]`.
func (p zoneParser) localAllowance() (*LocalAllowance, error) {
	args := p.d.RemainingArgs()
	la := new(LocalAllowance)
	if len(args) > 2 {
		return nil, p.errf("local_allowance takes at most a batch size and an expiry (local_allowance 50 100ms), got %q", strings.Join(args, " "))
	}
	if len(args) > 0 {
		n, err := p.count("local_allowance's batch size", args[0])
		if err != nil {
			return nil, err
		}
		la.MaxBatch = n
	}
	if len(args) > 1 {
		d, err := p.duration("local_allowance's expiry", args[1])
		if err != nil {
			return nil, err
		}
		la.Expiry = d
	}
	return la, nil
}

// zoneParser reads the values of one zone block; its errors name the zone
// and the file and line.
type zoneParser struct {
	d    *caddyfile.Dispenser
	name string
}

// settleRequestOption parses a settle option about the request: what a
// response without an amount is charged (unknown), whether usage is asked
// for (ask_usage). ok is false for another option.
func (p zoneParser) settleRequestOption(s *Settle, field string) (ok bool, err error) {
	switch field {
	case "unknown":
		args := p.d.RemainingArgs()
		switch {
		case len(args) == 1 && !strings.Contains(args[0], "{"):
			s.Unknown, err = p.count("settle: unknown", args[0])
		case len(args) == 2 && strings.Contains(args[0], "{"):
			s.UnknownFrom = args[0]
			if args[1] != "0" {
				s.Unknown, err = p.count("settle: unknown's amount", args[1])
			}
		default:
			err = p.errf("settle: unknown takes an amount, or a placeholder and an amount (unknown {http.rate_limit.request_json.max_tokens} 1000), got %q", strings.Join(args, " "))
		}
	case "ask_usage":
		var v string
		if v, err = p.arg("settle: ask_usage"); err == nil {
			if v != "on" && v != "off" {
				return true, p.errf("settle: ask_usage is on or off, got %q", v)
			}
			on := v == "on"
			s.AskUsage = &on
		}
	default:
		return false, nil
	}
	return true, err
}

func (p zoneParser) errf(format string, args ...any) error {
	return p.d.Errf("zone %q: "+format, append([]any{p.name}, args...)...)
}

// arg reads the field's one argument.
func (p zoneParser) arg(field string) (string, error) {
	return oneArg(p.d, fmt.Sprintf("zone %q: %s", p.name, field))
}

// count parses a count the JSON carries as it is: at least 1 (the JSON
// would read 0 as not set) and at most 2^53 (the adapted JSON rounds larger
// integers).
func (p zoneParser) count(field, v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil:
		return 0, p.errf("%s must be an integer, got %q", field, v)
	case n < 1:
		return 0, p.errf("%s must be at least 1, got %d", field, n)
	case n > 1<<53:
		return 0, p.errf("%s must be at most 2^53, got %d", field, n)
	}
	return n, nil
}

// duration parses a positive duration: the JSON would read 0 as not set.
func (p zoneParser) duration(field, v string) (caddy.Duration, error) {
	d, err := caddy.ParseDuration(v)
	switch {
	case err != nil:
		return 0, p.errf("%s: invalid duration %q: %v", field, v, err)
	case d <= 0:
		return 0, p.errf("%s must be positive, got %q", field, v)
	}
	return caddy.Duration(d), nil
}

// prefix reads a prefix length (0: not set).
func (p zoneParser) prefix(field string) (int, error) {
	v, err := p.arg(field)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, p.errf("%s must be an integer, got %q", field, v)
	}
	return n, nil
}

// perRequest reads `<field> <value>` or `<field> <placeholder> <default>`:
// a value chosen per request needs a default, used when the placeholder's
// value is empty or unusable.
func (p zoneParser) perRequest(field, example string) (ph, def string, err error) {
	args := p.d.RemainingArgs()
	isPh := func(a string) bool { return strings.Contains(a, "{") }
	switch {
	case len(args) == 0:
		return "", "", p.errf("%s needs a value", field)
	case len(args) == 1 && !isPh(args[0]):
		return "", args[0], nil
	case len(args) == 1:
		return "", "", p.errf("%s %s needs a default, used when the placeholder's value is empty or unusable: %s %s %s", field, args[0], field, args[0], example)
	case len(args) == 2 && isPh(args[0]) && !isPh(args[1]):
		return args[0], args[1], nil
	}
	return "", "", p.errf("%s takes a value, or a placeholder and a default (%s {plan_%s} %s), got %q", field, field, field, example, strings.Join(args, " "))
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

// parseResponse parses `response handle_errors`, `response problem` with
// an optional block of status and header, or a response block.
func parseResponse(d *caddyfile.Dispenser) (*Response, error) {
	r := new(Response)
	if d.NextArg() {
		switch d.Val() {
		case "handle_errors":
			r.HandleErrors = true
		case "problem":
			r.Problem = true
		default:
			return nil, d.Errf("rate_limit: response: unknown mode %q (known: handle_errors, problem), or write a block", d.Val())
		}
		if d.NextArg() {
			return nil, d.ArgErr()
		}
		if r.HandleErrors && d.NextBlock(d.Nesting()) {
			return nil, d.Err("rate_limit: response handle_errors takes no block: shape the response in handle_errors")
		}
		if r.HandleErrors {
			return r, nil
		}
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		if field != "header" {
			if seen[field] {
				return nil, d.Errf("rate_limit: response: duplicate %s", field)
			}
			seen[field] = true
		}
		switch field {
		case "status":
			v, err := oneArg(d, "rate_limit: response: status")
			if err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 { // 0 would read as not set
				return nil, d.Errf("rate_limit: response: status must be a positive integer, got %q", v)
			}
			r.StatusCode = n
		case "content_type":
			v, err := oneArg(d, "rate_limit: response: content_type")
			if err != nil {
				return nil, err
			}
			r.ContentType = v
		case "body":
			v, err := oneArg(d, "rate_limit: response: body")
			if err != nil {
				return nil, err
			}
			r.Body = v
		case "header":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return nil, d.Err("rate_limit: response: header needs a name and a value")
			}
			if r.Headers == nil {
				r.Headers = map[string][]string{}
			}
			r.Headers[args[0]] = append(r.Headers[args[0]], args[1])
		default:
			return nil, d.Errf("rate_limit: response: unknown option %q (known: status, content_type, body, header)", field)
		}
	}
	if len(seen) == 0 && r.Headers == nil && !r.Problem {
		return nil, d.Err("rate_limit: response needs a block, handle_errors or problem")
	}
	return r, nil
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
