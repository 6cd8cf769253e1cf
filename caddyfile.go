package sluice

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
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

// zoneDecl is what the adapter remembers of a zone to check that a name
// used in several places carries one limit.
type zoneDecl struct {
	limit algorithms.Limit
	dyn   string // the placeholders of a limit chosen per request
	place string
}

// stateKey is this directive's entry in the adapter's shared state.
const stateKey = "sluice.zones"

// parseCaddyfile sets up the handler from a rate_limit directive, applies
// the global option's defaults, and checks that a zone name used elsewhere
// in the Caddyfile carries the same limit.
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	handler := new(Handler)
	places, err := handler.unmarshal(h.Dispenser)
	if err != nil {
		return nil, err
	}
	if handler.StoreRaw == nil {
		if opts, ok := h.Option("rate_limit").(*globalOptions); ok && opts.storeRaw != nil {
			handler.StoreRaw = opts.storeRaw
		}
	}
	decls, _ := h.State[stateKey].(map[string]zoneDecl)
	if decls == nil {
		decls = map[string]zoneDecl{}
		h.State[stateKey] = decls
	}
	for name, z := range handler.RateLimits {
		l, err := z.limit()
		if err != nil {
			return nil, fmt.Errorf("zone %s (%s): %w", name, places[name], err)
		}
		dyn := z.dynamicSpec()
		if prev, ok := decls[name]; ok && (prev.limit != l || prev.dyn != dyn) {
			return nil, fmt.Errorf("zone %s: defined at %s with %s and at %s with %s; a zone name is one shared bucket, so every use must carry the same limit (rename one of them)",
				name, prev.place, describeDynamic(prev.limit, prev.dyn), places[name], describeDynamic(l, dyn))
		}
		decls[name] = zoneDecl{limit: l, dyn: dyn, place: places[name]}
	}
	return handler, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	rate_limit [<matcher>] {
//	    zone <name> {
//	        key         <candidate>...
//	        events      <n>|<placeholder> <default n>
//	        window      <duration>|<placeholder> <default duration>
//	        burst       <n>|<placeholder> <default n>
//	        algorithm   token_bucket|gcra|sliding_window|fixed_window|sliding_log
//	        cost        <n>|<placeholder> [<default n>]
//	        match {
//	            <matchers>
//	        }
//	        ipv4_prefix <bits>
//	        ipv6_prefix <bits>
//	        fail        open|closed|local
//	        report_only
//	        enabled     true|false
//	    }
//	    store memory {
//	        max_keys       <n>
//	        sweep_interval <duration>
//	    }
//	    store redis [<url>] {
//	        ...                        # see redisstore.Redis.UnmarshalCaddyfile
//	    }
//	    headers  legacy|draft|both|off
//	    response handle_errors
//	    response problem
//	    response {
//	        status       <code>
//	        content_type <type>
//	        body         <template>
//	        header       <name> <value>
//	    }
//	    jitter   <fraction>|<percent>%
//	    log_key
//	    report_only
//	    enabled  true|false
//	    sweep_interval  <duration>
//	    disable_metrics
//	}
//
// A Caddyfile has no ';': every block opens at the end of a line and closes
// on a line of its own. docs/reference.md documents every setting.
// events, window and burst take either a value, or a placeholder resolved per
// request and the default used when its value is empty or unusable (events
// {plan_events} 60); cost takes a value or a placeholder, with an optional
// default (1).
//
// caddy-ratelimit's sweep_interval and disable_metrics are accepted;
// its distributed and storage are refused with the Sluice equivalent.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, err := h.unmarshal(d)
	return err
}

// unmarshal parses the directive and returns where each zone was defined.
func (h *Handler) unmarshal(d *caddyfile.Dispenser) (map[string]string, error) {
	places := map[string]string{}
	d.Next() // the directive's name
	if d.NextArg() {
		return nil, d.Errf("rate_limit: unexpected argument %q (a matcher goes right after rate_limit; settings go in the block)", d.Val())
	}
	seen := map[string]bool{}
	once := func(name string) error {
		if seen[name] {
			return d.Errf("rate_limit: duplicate %s", name)
		}
		seen[name] = true
		return nil
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		switch field {
		case "zone":
			if !d.NextArg() {
				return nil, d.Err("rate_limit: zone needs a name")
			}
			name := d.Val()
			if err := validZoneName(name); err != nil {
				return nil, d.Errf("rate_limit: %v", err)
			}
			if d.NextArg() {
				return nil, d.Errf("zone %s: unexpected argument %q", name, d.Val())
			}
			place := d.File() + ":" + strconv.Itoa(d.Line())
			z, err := parseZone(d, name)
			if err != nil {
				return nil, err
			}
			if prev, dup := h.RateLimits[name]; dup {
				// caddy-ratelimit accepts a zone repeated as it is; one
				// repeated with other settings is two limits for one bucket.
				if !sameZone(prev, z) {
					return nil, fmt.Errorf("zone %s: defined at %s and again, with other settings, at %s; a zone name is one bucket with one limit (rename one of them)", name, places[name], place)
				}
				continue
			}
			places[name] = place
			if h.RateLimits == nil {
				h.RateLimits = map[string]*Zone{}
			}
			h.RateLimits[name] = z

		case "store":
			if err := once(field); err != nil {
				return nil, err
			}
			raw, err := parseStore(d)
			if err != nil {
				return nil, err
			}
			h.StoreRaw = raw

		case "headers":
			if err := once(field); err != nil {
				return nil, err
			}
			v, err := oneArg(d, "rate_limit: headers")
			if err != nil {
				return nil, err
			}
			switch v {
			case headersLegacy, headersDraft, headersBoth, headersOff:
			default:
				return nil, d.Errf("rate_limit: headers: unknown mode %q (known: legacy, draft, both, off)", v)
			}
			h.Headers = v

		case "response":
			if err := once(field); err != nil {
				return nil, err
			}
			r, err := parseResponse(d)
			if err != nil {
				return nil, err
			}
			h.Response = r

		case "jitter":
			if err := once(field); err != nil {
				return nil, err
			}
			v, err := oneArg(d, "rate_limit: jitter")
			if err != nil {
				return nil, err
			}
			j, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
			// NaN and ±Inf parse, but JSON cannot carry them: the handler
			// would be lost from the adapted config with a misleading error.
			if err != nil || math.IsNaN(j) || math.IsInf(j, 0) {
				return nil, d.Errf("rate_limit: jitter must be a fraction (0.2) or a percentage (20%%), got %q", v)
			}
			if strings.HasSuffix(v, "%") {
				j /= 100
			}
			h.Jitter = j // checked by Validate

		case "report_only":
			if err := once(field); err != nil {
				return nil, err
			}
			if d.NextArg() {
				return nil, d.Errf("rate_limit: report_only takes no argument, got %q", d.Val())
			}
			h.ReportOnly = true

		case "log_key":
			if err := once(field); err != nil {
				return nil, err
			}
			if d.NextArg() {
				return nil, d.Errf("rate_limit: log_key takes no argument, got %q", d.Val())
			}
			h.LogKey = true

		case "enabled":
			if err := once(field); err != nil {
				return nil, err
			}
			v, err := oneArg(d, "rate_limit: enabled")
			if err != nil {
				return nil, err
			}
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, d.Errf("rate_limit: enabled must be true or false, got %q", v)
			}
			h.Enabled = &b

		case "sweep_interval":
			if err := once(field); err != nil {
				return nil, err
			}
			v, err := oneArg(d, "rate_limit: sweep_interval")
			if err != nil {
				return nil, err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return nil, d.Errf("rate_limit: sweep_interval must be a positive duration, got %q", v)
			}
			h.SweepInterval = caddy.Duration(dur)

		case "disable_metrics":
			if err := once(field); err != nil {
				return nil, err
			}
			if d.NextArg() {
				return nil, d.Errf("rate_limit: disable_metrics takes no argument, got %q", d.Val())
			}
			h.DisableMetrics = true

		case "distributed":
			return nil, d.Err("rate_limit: distributed is not supported: Sluice shares exact state through a shared store instead of synchronising through Caddy storage; use `store redis { url ... }`")

		case "storage":
			return nil, d.Err("rate_limit: storage is not supported: Sluice keeps rate limit state in its own store; use `store memory` (the default) or `store redis { url ... }`")

		default:
			return nil, d.Errf("rate_limit: unknown subdirective %q (known: zone, store, headers, response, jitter, log_key, report_only, enabled, sweep_interval, disable_metrics)", field)
		}
	}
	if len(h.RateLimits) == 0 {
		return nil, d.Err("rate_limit: at least one zone is required")
	}
	return places, nil
}

// sameZone reports whether two zone configurations are the same, as their
// JSON says.
func sameZone(a, b *Zone) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// parseZone parses a zone block; the dispenser is on the zone's name.
func parseZone(d *caddyfile.Dispenser, name string) (*Zone, error) {
	z := new(Zone)
	seen := map[string]bool{}
	errf := func(format string, args ...any) error {
		return d.Errf("zone %s: "+format, append([]any{name}, args...)...)
	}
	checkInt := func(field, v string, min, max int64) (int64, error) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, errf("%s must be an integer, got %q", field, v)
		}
		if n < min || n > max {
			if max == 1<<62 {
				return 0, errf("%s must be at least %d, got %d", field, min, n)
			}
			return 0, errf("%s must be between %d and %d, got %d", field, min, max, n)
		}
		return n, nil
	}
	intArg := func(field string, min, max int64) (int64, error) {
		v, err := oneArg(d, "zone "+name+": "+field)
		if err != nil {
			return 0, err
		}
		return checkInt(field, v, min, max)
	}
	// perRequest reads `<field> <value>` or `<field> <placeholder>
	// <default>`: a value chosen per request needs a default, used when the
	// placeholder's value is empty or unusable.
	perRequest := func(field, example string) (ph, def string, err error) {
		args := d.RemainingArgs()
		isPh := func(a string) bool { return strings.Contains(a, "{") }
		switch {
		case len(args) == 0:
			return "", "", errf("%s needs a value", field)
		case len(args) == 1 && !isPh(args[0]):
			return "", args[0], nil
		case len(args) == 1:
			return "", "", errf("%s %s needs a default, used when the placeholder's value is empty or unusable: %s %s %s", field, args[0], field, args[0], example)
		case len(args) == 2 && isPh(args[0]) && !isPh(args[1]):
			return args[0], args[1], nil
		}
		return "", "", errf("%s takes a value, or a placeholder and a default (%s {plan_%s} %s), got %q", field, field, field, example, strings.Join(args, " "))
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		if field != "match" {
			if seen[field] {
				return nil, errf("duplicate %s", field)
			}
			seen[field] = true
		}
		var err error
		switch field {
		case "key":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return nil, errf("key needs at least one candidate, e.g. key {http.auth.user.id} {client_ip}")
			}
			z.Key = args
		case "events":
			var ph, v string
			if ph, v, err = perRequest(field, "60"); err != nil {
				return nil, err
			}
			z.MaxEventsFrom = ph
			z.MaxEvents, err = checkInt(field, v, 1, 1<<62)
		case "burst":
			var ph, v string
			if ph, v, err = perRequest(field, "20"); err != nil {
				return nil, err
			}
			z.BurstFrom = ph
			z.Burst, err = checkInt(field, v, 1, 1<<62)
		case "window":
			var ph, v string
			if ph, v, err = perRequest(field, "1m"); err != nil {
				return nil, err
			}
			dur, perr := caddy.ParseDuration(v)
			if perr != nil {
				return nil, errf("window: invalid duration %q: %v", v, perr)
			}
			if dur <= 0 {
				return nil, errf("window must be positive, got %q", v)
			}
			z.Window = caddy.Duration(dur)
			z.WindowFrom = ph
		case "algorithm":
			var v string
			if v, err = oneArg(d, "zone "+name+": algorithm"); err != nil {
				return nil, err
			}
			z.Algorithm = v
		case "cost":
			args := d.RemainingArgs()
			switch {
			case len(args) == 0:
				return nil, errf("cost needs a value")
			case len(args) == 2 && strings.Contains(args[0], "{"):
				if z.CostDefault, err = checkInt("cost's default", args[1], 1, 1<<62); err != nil {
					return nil, err
				}
			case len(args) != 1:
				return nil, errf("cost takes an integer, or a placeholder and an optional default (cost {cost} 1), got %q", strings.Join(args, " "))
			}
			z.Cost = caddyhttp.WeakString(args[0])
		case "report_only":
			if d.NextArg() {
				return nil, errf("report_only takes no argument, got %q", d.Val())
			}
			z.ReportOnly = true
		case "enabled":
			var v string
			if v, err = oneArg(d, "zone "+name+": enabled"); err != nil {
				return nil, err
			}
			b, perr := strconv.ParseBool(v)
			if perr != nil {
				return nil, errf("enabled must be true or false, got %q", v)
			}
			z.Enabled = &b
		case "fail":
			var v string
			if v, err = oneArg(d, "zone "+name+": fail"); err != nil {
				return nil, err
			}
			switch v {
			case failOpenPolicy, failClosedPolicy, failLocalPolicy:
			default:
				return nil, errf("fail: unknown policy %q (known: open, closed, local)", v)
			}
			z.Fail = v
		case "match":
			if d.NextArg() {
				return nil, errf("match takes a block of matchers, not %q", d.Val())
			}
			set, perr := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if perr != nil {
				return nil, errf("match: %v", perr)
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
		case "ipv4_prefix":
			var n int64
			n, err = intArg(field, 0, 32) // 0: not set (caddy-ratelimit's meaning)
			z.IPv4Prefix = int(n)
		case "ipv6_prefix":
			var n int64
			n, err = intArg(field, 0, 128)
			z.IPv6Prefix = int(n)
		default:
			return nil, errf("unknown subdirective %q (known: key, events, window, burst, algorithm, cost, match, ipv4_prefix, ipv6_prefix, fail, report_only, enabled)", field)
		}
		if err != nil {
			return nil, err
		}
	}
	if z.MaxEvents == 0 {
		return nil, errf("events is required")
	}
	if z.Window == 0 {
		return nil, errf("window is required")
	}
	l, err := z.limit()
	if err != nil {
		return nil, errf("%v", err)
	}
	// The per-request fields and the cost, checked now so that the error
	// names the file and line.
	check := &zone{limit: l, cost: 1}
	if err := check.compileCost(z); err != nil {
		return nil, errf("%v", err)
	}
	if err := check.compileDynamic(z); err != nil {
		return nil, errf("%v", err)
	}
	return z, nil
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
			if err != nil || n < 400 || n > 599 {
				return nil, d.Errf("rate_limit: response: status must be between 400 and 599, got %q", v)
			}
			r.StatusCode = n
		case "content_type":
			if r.Problem {
				return nil, d.Err("rate_limit: response problem writes the body and its content type itself; it takes status and header only")
			}
			v, err := oneArg(d, "rate_limit: response: content_type")
			if err != nil {
				return nil, err
			}
			r.ContentType = v
		case "body":
			if r.Problem {
				return nil, d.Err("rate_limit: response problem writes the body and its content type itself; it takes status and header only")
			}
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
