package zonemodel

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// ParseZone parses a zone block of the rate_limit directive's Caddyfile;
// the dispenser is on the zone's name. at gets where each field was first
// written.
func ParseZone(d *caddyfile.Dispenser, name string, at map[string]caddyfile.Token) (*Zone, error) {
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
			err = p.cost(z)
		case "report_only":
			if d.NextArg() {
				return nil, p.errf("report_only takes no argument, got %q", d.Val())
			}
			z.ReportOnly = true
		case "enabled":
			z.Enabled, err = p.enabled()
		case "fail":
			z.Fail, err = p.arg(field)
		case "match":
			err = p.match(z)
		case "local_allowance":
			z.LocalAllowance, err = p.localAllowance()
		case "sync":
			z.Sync, err = p.sync()
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
		case "delay_after":
			if v, err = p.arg(field); err == nil {
				z.DelayAfter, err = p.count(field, v)
			}
		case "max_overrides":
			if v, err = p.arg(field); err == nil {
				var n int64
				n, err = p.count(field, v)
				z.MaxOverrides = int(n)
			}
		case "concurrent":
			err = p.concurrent(z)
		case "lease":
			if v, err = p.arg(field); err == nil {
				z.Lease, err = p.duration(field, v)
			}
		default:
			return nil, p.errf("unknown subdirective %q (known: key, events, window, burst, algorithm, cost, match, ipv4_prefix, ipv6_prefix, fail, report_only, enabled, count, settle, on_exceed, penalty, delay, delay_after, concurrent, lease, local_allowance, sync, max_overrides)", field)
		}
		if err != nil {
			return nil, err
		}
	}
	return z, nil
}

// cost parses `cost <n>` or `cost <placeholder> [<default>]`.
func (p zoneParser) cost(z *Zone) (err error) {
	args := p.d.RemainingArgs()
	switch {
	case len(args) == 0:
		return p.errf("cost needs a value")
	case len(args) == 2 && strings.Contains(args[0], "{"):
		z.CostDefault, err = p.count("cost's default", args[1])
	case len(args) != 1:
		return p.errf("cost takes an integer, or a placeholder and an optional default (cost {cost} 1), got %q", strings.Join(args, " "))
	}
	z.Cost = caddyhttp.WeakString(args[0])
	return err
}

// enabled parses `enabled true|false`.
func (p zoneParser) enabled() (*bool, error) {
	v, err := p.arg("enabled")
	if err != nil {
		return nil, err
	}
	b, perr := strconv.ParseBool(v)
	if perr != nil {
		return &b, p.errf("enabled must be true or false, got %q", v)
	}
	return &b, nil
}

// match parses a `match { ... }` block of matchers, one more matcher set.
func (p zoneParser) match(z *Zone) error {
	if p.d.NextArg() {
		return p.errf("match takes a block of matchers, not %q", p.d.Val())
	}
	set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(p.d)
	if err != nil {
		return p.errf("match: %v", err)
	}
	z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
	return nil
}

// concurrent parses `concurrent <n>`, `concurrent <placeholder> <default>`
// or `concurrent adaptive { ... }`.
func (p zoneParser) concurrent(z *Zone) (err error) {
	d := p.d
	if d.NextArg() {
		if d.Val() == "adaptive" {
			if d.NextArg() {
				return p.errf("concurrent adaptive takes a block of settings, not %q", d.Val())
			}
			z.Adaptive, err = p.adaptive()
			return err
		}
		d.Prev()
	}
	var v string
	if z.ConcurrentFrom, v, err = p.perRequest("concurrent", "10"); err == nil {
		z.Concurrent, err = p.count("concurrent", v)
	}
	return err
}

// adaptive parses the block of `concurrent adaptive { ... }` (none: every
// setting at its default); the dispenser is on "adaptive".
func (p zoneParser) adaptive() (*Adaptive, error) {
	a := new(Adaptive)
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
		if _, err := ParseStatuses("settle: free", s.FreeStatuses()); err != nil {
			return p.errf("%v", err)
		}
	default:
		return p.errf("settle: unknown option %q (known: free, unknown, ask_usage)", field)
	}
	return nil
}

// sync parses `sync <interval> [<max_keys>]`.
func (p zoneParser) sync() (*Sync, error) {
	args := p.d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return nil, p.errf("sync takes an interval and at most a key bound (sync 50ms, sync 50ms 100000), got %q", strings.Join(args, " "))
	}
	d, err := p.duration("sync's interval", args[0])
	if err != nil {
		return nil, err
	}
	s := &Sync{Interval: d}
	if len(args) > 1 {
		n, err := p.count("sync's max_keys", args[1])
		if err != nil {
			return nil, err
		}
		s.MaxKeys = int(min(n, MaxSyncKeys+1))
	}
	return s, nil
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
