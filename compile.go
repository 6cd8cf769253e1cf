package sluice

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/internal/zonename"
)

// zone is a Zone compiled at Provision: the hot path parses nothing.
type zone struct {
	name     string
	limit    algorithms.Limit
	cost     int64
	matchers caddyhttp.MatcherSets
	deriver  *identity.Deriver
	fail     string
	// costExpr is the per-request cost placeholder, or nil for a static
	// cost (cost is then the default).
	costExpr *identity.Candidate
	// dyn is the limit chosen per request, or nil for a static limit: then
	// nothing about the limit is parsed per request.
	dyn *dynamicLimit
	// dynSpec renders dyn's placeholders ("" for a static limit), for the
	// check that every use of a zone name carries the same limit.
	dynSpec string
	// conc is a concurrency zone's run time (concurrency.go); nil for a
	// rate zone.
	conc *concurrencyZone
	// badValue rate-limits the log line about unusable per-request values
	// (cost, events, window, burst); nil when nothing is chosen per request.
	badValue *sampledLog
	// shown is what responses show of the zone's default limit.
	shown shownLimit
	// metrics are the zone's counters; nil with disable_metrics.
	metrics    *zoneMetrics
	reportOnly bool
	// counts are the response statuses the zone charges (count.go); nil:
	// every response. countSpec is the setting as written.
	counts    *statusSet
	countSpec []string
	// pass forwards a request the zone would refuse (on_exceed pass,
	// pass.go).
	pass bool
	// allowance is the zone's local allowance (nil: none), given to the
	// store at Provision.
	allowance *LocalAllowance
	// The name as each sink carries it (see setNames): JSON-escaped (without
	// the quotes), the policy identifier of the IETF RateLimit fields, that
	// identifier as a serialised sf-string and as a JSON string (both with
	// their quotes).
	jsonName, policyID, sfName, jsonPolicyID string
}

// setNames fills in the forms of z's name each sink carries.
func (z *zone) setNames() {
	z.jsonName = jsonEscape(z.name)
	z.policyID = zonename.Policy(z.name)
	z.sfName = sfString(z.policyID)
	z.jsonPolicyID = `"` + jsonEscape(z.policyID) + `"`
}

// limit compiles the zone's limit, with errors naming the field.
func (z *Zone) limit() (algorithms.Limit, error) {
	if z.concurrentZero && z.MaxEvents == 0 {
		return algorithms.Limit{}, fmt.Errorf("concurrent must be between 1 and %d, got 0", algorithms.MaxConcurrent)
	}
	if z.isConcurrency() {
		return z.concurrencyLimit() // concurrency.go
	}
	alg, err := algorithms.ParseAlgorithm(z.Algorithm)
	if err != nil {
		return algorithms.Limit{}, fmt.Errorf("algorithm: %w", err)
	}
	switch {
	case z.MaxEvents == 0:
		return algorithms.Limit{}, errors.New("events (max_events) is required")
	case z.MaxEvents < 0:
		return algorithms.Limit{}, fmt.Errorf("events (max_events) must be positive, got %d", z.MaxEvents)
	case z.Window == 0:
		return algorithms.Limit{}, errors.New("window is required")
	case time.Duration(z.Window) < time.Millisecond:
		return algorithms.Limit{}, fmt.Errorf("window must be at least 1ms, got %s", time.Duration(z.Window))
	case time.Duration(z.Window)%time.Millisecond != 0:
		// Refused rather than truncated: 1500us read as 1ms nearly doubles
		// the rate.
		w := time.Duration(z.Window)
		return algorithms.Limit{}, fmt.Errorf("window must be a whole number of milliseconds (the limiter's resolution), got %s; use %s", w, w.Truncate(time.Millisecond)+time.Millisecond)
	case z.Burst < 0:
		return algorithms.Limit{}, fmt.Errorf("burst must be positive, got %d", z.Burst)
	}
	l, err := algorithms.NewLimit(alg, z.MaxEvents, time.Duration(z.Window), z.Burst)
	if errors.Is(err, algorithms.ErrBurstNotAllowed) {
		return l, fmt.Errorf("burst: %w", err)
	}
	if err != nil {
		return l, fmt.Errorf("events/window/burst: %w", err)
	}
	return l, nil
}

// compile checks the zone's configuration and builds its runtime form; the
// errors name the field (the caller names the zone). Matchers are loaded by
// the caller.
func (z *Zone) compile(name string) (*zone, error) {
	if err := validZoneName(name); err != nil {
		return nil, err
	}
	l, err := z.limit()
	if err != nil {
		return nil, err
	}
	if z.IPv4Prefix < 1 || z.IPv4Prefix > 32 {
		return nil, fmt.Errorf("ipv4_prefix must be between 0 and 32 (0: the default, 32), got %d", z.IPv4Prefix)
	}
	if z.IPv6Prefix < 1 || z.IPv6Prefix > 128 {
		return nil, fmt.Errorf("ipv6_prefix must be between 0 and 128 (0: the default, 64), got %d", z.IPv6Prefix)
	}
	switch z.Fail {
	case failOpenPolicy, failClosedPolicy, failLocalPolicy:
	default:
		return nil, fmt.Errorf("fail: unknown policy %q (known: open, closed, local)", z.Fail)
	}
	cands := make([]identity.Candidate, 0, len(z.Key))
	for _, k := range z.Key {
		c, err := identity.Compile(k)
		if err != nil {
			return nil, fmt.Errorf("key: %w", err)
		}
		cands = append(cands, c)
	}
	der, err := identity.NewDeriver(cands, z.IPv4Prefix, z.IPv6Prefix)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	zn := &zone{name: name, limit: l, cost: 1, deriver: der, fail: z.Fail, reportOnly: z.ReportOnly, allowance: z.LocalAllowance}
	if err := z.checkAllowance(); err != nil {
		return nil, err
	}
	zn.setNames()
	if err := zn.compileCost(z); err != nil {
		return nil, err
	}
	zn.shown = zn.showLimit(l)
	if err := zn.compileDynamic(z); err != nil {
		return nil, err
	}
	if err := compileControls(zn, z); err != nil {
		return nil, err
	}
	if zn.costExpr != nil || zn.dyn != nil {
		zn.badValue = newSampledLog(1, badValueInterval)
	}
	return zn, nil
}

// checkAllowance checks local_allowance's values and what it combines
// with: the settings that need every request of a key decided by the
// store itself (a refund's instant, a penalty's start, a delay's schedule)
// cannot be spent from a batch drawn earlier.
func (z *Zone) checkAllowance() error {
	la := z.LocalAllowance
	if la == nil {
		return nil
	}
	if la.MaxBatch < 0 || la.Expiry < 0 {
		return errors.New("local_allowance: max_batch and expiry must be positive")
	}
	for _, c := range []struct {
		set  bool
		name string
	}{{z.isConcurrency(), "concurrent"}, {len(z.Count) > 0, "count"}, {z.Penalty > 0, "penalty"}, {z.Delay > 0, "delay"}} {
		if c.set {
			return fmt.Errorf("local_allowance: not with %s (every request of the key must be decided by the store)", c.name)
		}
	}
	return nil
}

// compileCost sets the zone's static cost or its per-request placeholder
// and default.
func (z *zone) compileCost(cfg *Zone) error {
	raw, def := strings.TrimSpace(string(cfg.Cost)), cfg.CostDefault
	if def != 0 && !strings.Contains(raw, "{") {
		return errors.New("cost_default applies only to a placeholder cost, such as {cost}")
	}
	if def < 0 {
		return fmt.Errorf("cost_default must be a positive integer, got %d", def)
	}
	if def > z.limit.Capacity() {
		return fmt.Errorf("cost_default %d exceeds the zone's capacity %d: no request could ever pass", def, z.limit.Capacity())
	}
	if raw == "" {
		return nil
	}
	if !strings.Contains(raw, "{") {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("cost must be a positive integer or a placeholder, got %q", raw)
		}
		if n > z.limit.Capacity() {
			return fmt.Errorf("cost %d exceeds the zone's capacity %d: no request could ever pass", n, z.limit.Capacity())
		}
		z.cost = n
		return nil
	}
	c, err := identity.Compile(raw)
	if err != nil {
		return fmt.Errorf("cost: %w", err)
	}
	if c.Placeholders() == nil {
		return fmt.Errorf("cost must be a positive integer or a placeholder, got %q", raw)
	}
	z.costExpr = &c
	if def > 0 {
		z.cost = def
	}
	return nil
}

// dynamicSpec renders the zone's per-request fields ("" when the limit is
// static), for the checks that one zone name carries one limit.
func (z *Zone) dynamicSpec() string {
	var parts []string
	for _, f := range []struct{ name, v string }{
		{"max_events_from", z.MaxEventsFrom}, {"window_from", z.WindowFrom}, {"burst_from", z.BurstFrom},
	} {
		if v := strings.TrimSpace(f.v); v != "" {
			parts = append(parts, f.name+" "+v)
		}
	}
	return strings.Join(parts, " ")
}

// compileDynamic compiles the fields of the limit chosen per request. The
// static fields are then the defaults, already checked by limit.
func (z *zone) compileDynamic(cfg *Zone) error {
	var d dynamicLimit
	for _, f := range []struct {
		field, raw string
		dst        **identity.Candidate
	}{
		{"max_events_from", cfg.MaxEventsFrom, &d.events},
		{"window_from", cfg.WindowFrom, &d.window},
		{"burst_from", cfg.BurstFrom, &d.burst},
	} {
		raw := strings.TrimSpace(f.raw)
		if raw == "" {
			continue
		}
		c, err := identity.Compile(raw)
		if err != nil || c.Placeholders() == nil {
			return fmt.Errorf("%s must be a placeholder, such as {plan_events}, got %q", f.field, raw)
		}
		*f.dst = &c
	}
	if d.events == nil && d.window == nil && d.burst == nil {
		return nil
	}
	if d.burst != nil {
		if !z.limit.Algorithm.AllowsBurst() {
			return fmt.Errorf("burst_from: %s: %w", z.limit.Algorithm, algorithms.ErrBurstNotAllowed)
		}
		if z.limit.Burst == 0 {
			return errors.New("burst_from needs a default: set burst too (the burst used when the placeholder's value is unusable)")
		}
	}
	z.dyn = &d
	z.dynSpec = cfg.dynamicSpec()
	return nil
}

// describeDynamic renders a limit and the placeholders that choose it per
// request.
func describeDynamic(l algorithms.Limit, dyn string) string {
	if dyn == "" {
		return describeLimit(l)
	}
	return describeLimit(l) + " " + dyn
}

// describeLimit renders a limit as the Caddyfile would write it.
func describeLimit(l algorithms.Limit) string {
	if l.Algorithm == algorithms.Concurrency {
		return fmt.Sprintf("concurrent %d lease %s", l.Events, time.Duration(l.Window)*time.Millisecond)
	}
	s := fmt.Sprintf("events %d window %s", l.Events, time.Duration(l.Window)*time.Millisecond)
	if l.Burst > 0 {
		s += fmt.Sprintf(" burst %d", l.Burst)
	}
	if l.Penalty > 0 {
		s += fmt.Sprintf(" penalty %s", time.Duration(l.Penalty)*time.Millisecond)
	}
	if l.Delay > 0 {
		s += fmt.Sprintf(" delay %s", time.Duration(l.Delay)*time.Millisecond)
	}
	if l.DelayAfter > 0 {
		s += fmt.Sprintf(" delay_after %d", l.DelayAfter)
	}
	return s + " algorithm " + l.Algorithm.String()
}
