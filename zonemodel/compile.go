package zonemodel

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/caddy-sluice/adaptive"
	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
)

// Compiled is a zone's configuration checked, with every default resolved:
// what the handler's runtime zone is built from and what the simulator
// reports.
type Compiled struct {
	Name string
	// Limit is the zone's limit when nothing is chosen per request:
	// algorithm, events, window (a concurrency zone's lease), burst,
	// penalty and delay.
	Limit algorithms.Limit
	// Deriver identifies the client from the key candidates.
	Deriver *identity.Deriver
	// Cost is the static cost, or a per-request cost's default.
	Cost int64
	// CostFrom is the per-request cost placeholder; nil: Cost is static.
	CostFrom *identity.Candidate
	// EventsFrom, WindowFrom and BurstFrom choose the limit per request
	// (a concurrency zone's concurrent_from is its EventsFrom); nil: the
	// field is static.
	EventsFrom, WindowFrom, BurstFrom *identity.Candidate
	// DynamicSpec renders the per-request fields as written ("" for a
	// static limit), for the check that one zone name carries one limit.
	DynamicSpec string
	// Fail is the fail policy (FailOpen, FailClosed, FailLocal).
	Fail       string
	ReportOnly bool
	Enabled    bool
	// Allowance is the zone's local allowance; nil: none.
	Allowance *LocalAllowance
	// Settle is where the zone reads the actual amount; nil: none.
	Settle *Settle
	// Sync is the zone's asynchronous mode; nil: exact.
	Sync *Sync
	// Adaptive is an adaptive concurrency zone's controller settings,
	// resolved; nil for another zone. AdaptiveWait is its delay: how long
	// a request over the limit may wait for a place (0: refused at once).
	Adaptive     *adaptive.Settings
	AdaptiveWait time.Duration
	// MaxOverrides bounds the zone's overrides (0: DefaultMaxOverrides).
	MaxOverrides int
}

// The bound of a zone's overrides: its default and the most it may be.
const (
	DefaultMaxOverrides = 1000
	MaxMaxOverrides     = 100_000
)

// Dynamic reports whether the zone's limit is chosen per request.
func (c *Compiled) Dynamic() bool {
	return c.EventsFrom != nil || c.WindowFrom != nil || c.BurstFrom != nil
}

// Concurrent returns a concurrency zone's slots per key; 0 for a rate zone.
func (c *Compiled) Concurrent() int64 {
	if c.Limit.Algorithm != algorithms.Concurrency {
		return 0
	}
	return c.Limit.Events
}

// Compile checks the zone's configuration, with SetDefaults applied, and
// compiles it; the errors name the field (the caller names the zone). The
// matchers are left to the caller: they are Caddy modules.
func (z *Zone) Compile(name string) (*Compiled, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	l, err := z.Limit()
	if err != nil {
		return nil, err
	}
	if l.Penalty, err = z.penalty(); err != nil {
		return nil, err
	}
	if z.Adaptive == nil {
		if err := z.delay(&l); err != nil {
			return nil, err
		}
	}
	if z.IPv4Prefix < 1 || z.IPv4Prefix > 32 {
		return nil, fmt.Errorf("ipv4_prefix must be between 0 and 32 (0: the default, 32), got %d", z.IPv4Prefix)
	}
	if z.IPv6Prefix < 1 || z.IPv6Prefix > 128 {
		return nil, fmt.Errorf("ipv6_prefix must be between 0 and 128 (0: the default, 64), got %d", z.IPv6Prefix)
	}
	switch z.Fail {
	case FailOpen, FailClosed, FailLocal:
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
	if err := z.checkAllowance(); err != nil {
		return nil, err
	}
	if err := z.checkSettle(); err != nil {
		return nil, err
	}
	if err := z.checkSync(l.Algorithm); err != nil {
		return nil, err
	}
	if z.MaxOverrides < 0 || z.MaxOverrides > MaxMaxOverrides {
		return nil, fmt.Errorf("max_overrides must be between 1 and %d (0: the default, %d), got %d", MaxMaxOverrides, DefaultMaxOverrides, z.MaxOverrides)
	}
	if z.MaxOverrides > 0 && z.IsConcurrency() {
		return nil, errors.New("max_overrides does not apply to a concurrency zone: overrides change a rate zone's limit")
	}
	c := &Compiled{MaxOverrides: z.MaxOverrides, Name: name, Limit: l, Cost: 1, Deriver: der, Fail: z.Fail, ReportOnly: z.ReportOnly,
		Enabled: z.IsEnabled(), Allowance: z.LocalAllowance, Settle: z.Settle, Sync: z.Sync}
	if err := c.compileCost(z); err != nil {
		return nil, err
	}
	if err := c.compileDynamic(z); err != nil {
		return nil, err
	}
	if err := c.compileAdaptive(z); err != nil {
		return nil, err
	}
	return c, nil
}

// Limit compiles the zone's limit, without its penalty and delay, with
// errors naming the field.
func (z *Zone) Limit() (algorithms.Limit, error) {
	if z.concurrentZero && z.MaxEvents == 0 {
		return algorithms.Limit{}, fmt.Errorf("concurrent must be between 1 and %d, got 0", algorithms.MaxConcurrent)
	}
	if z.Adaptive != nil {
		return z.adaptiveLimit()
	}
	if z.IsConcurrency() {
		return z.concurrencyLimit()
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

// fieldSet is a field's name and whether the zone sets it.
type fieldSet struct {
	name string
	set  bool
}

// rateFields are the fields of a rate, which a concurrency zone (fixed or
// adaptive) does not take.
func (z *Zone) rateFields() []fieldSet {
	return []fieldSet{
		{"events (max_events)", z.MaxEvents != 0}, {"window", z.Window != 0}, {"burst", z.Burst != 0},
		{"algorithm", z.Algorithm != ""}, {"cost", z.Cost != ""}, {"cost_default", z.CostDefault != 0},
		{"max_events_from", z.MaxEventsFrom != ""}, {"window_from", z.WindowFrom != ""}, {"burst_from", z.BurstFrom != ""},
	}
}

// concurrencyLimit compiles a concurrency zone's limit (see Limit), with
// errors naming the field.
func (z *Zone) concurrencyLimit() (algorithms.Limit, error) {
	if z.Concurrent == 0 && z.ConcurrentFrom == "" {
		return algorithms.Limit{}, errors.New("lease applies only to a concurrency zone (set concurrent); a rate zone has no lease")
	}
	for _, f := range z.rateFields() {
		if f.set {
			return algorithms.Limit{}, fmt.Errorf("%s does not apply to a concurrency zone (concurrent): it limits the requests in flight, not a rate; put the rate in a zone of its own", f.name)
		}
	}
	switch {
	case len(z.Count) > 0:
		return algorithms.Limit{}, errors.New("count does not apply to a concurrency zone (concurrent): its slot is given back when the request ends, whatever the response's status; count in a rate zone of its own")
	case z.Penalty != 0:
		return algorithms.Limit{}, errors.New("penalty does not apply to a concurrency zone (concurrent): a key is refused while its slots are in use, and no longer; put the penalty on a rate zone")
	case z.Delay != 0 || z.DelayAfter != 0:
		return algorithms.Limit{}, errors.New("delay does not apply to a concurrency zone (concurrent): a request over its slots is refused, it does not wait for one; delay a rate zone (a request admitted to wait holds its slot while it waits)")
	}
	switch {
	case z.Concurrent == 0:
		return algorithms.Limit{}, errors.New("concurrent_from needs a default: set concurrent too (the limit used when the placeholder's value is unusable)")
	case z.Concurrent < 1 || z.Concurrent > algorithms.MaxConcurrent:
		return algorithms.Limit{}, fmt.Errorf("concurrent must be between 1 and %d, got %d", algorithms.MaxConcurrent, z.Concurrent)
	}
	lease := time.Duration(z.Lease)
	if lease == 0 {
		lease = DefaultLease
	}
	if lease%time.Millisecond != 0 {
		return algorithms.Limit{}, fmt.Errorf("lease must be a whole number of milliseconds, got %s", lease)
	}
	l, err := algorithms.NewConcurrencyLimit(z.Concurrent, lease)
	if err != nil {
		return l, fmt.Errorf("lease must be between %s and %s, got %s", time.Duration(algorithms.MinLease)*time.Millisecond,
			time.Duration(algorithms.MaxLease)*time.Millisecond, lease)
	}
	return l, nil
}

// penalty returns the zone's penalty in milliseconds (0: none), checked.
// It travels in the limit (Limit.Penalty), so one zone name carries one
// penalty, as it carries one limit; what it does: docs/algorithms.md.
func (z *Zone) penalty() (int64, error) {
	p := time.Duration(z.Penalty)
	switch {
	case p == 0:
		return 0, nil
	case p < time.Millisecond:
		return 0, fmt.Errorf("penalty must be at least 1ms, got %s", p)
	case p%time.Millisecond != 0:
		return 0, fmt.Errorf("penalty must be a whole number of milliseconds, got %s", p)
	case p.Milliseconds() > algorithms.MaxRefill:
		return 0, fmt.Errorf("penalty must not exceed 100 years, got %s", p)
	}
	return p.Milliseconds(), nil
}

// delay returns the zone's delay and delay_after into l, checked. What a
// delay does: docs/algorithms.md ("Smooth or refuse").
func (z *Zone) delay(l *algorithms.Limit) error {
	d := time.Duration(z.Delay)
	switch {
	case d == 0 && z.DelayAfter != 0:
		return errors.New("delay_after needs delay (the longest a request may wait for its turn)")
	case d == 0:
		return nil
	case !l.Algorithm.AllowsBurst():
		return fmt.Errorf("delay: %s: %w", l.Algorithm, algorithms.ErrDelayNotAllowed)
	case d < time.Millisecond:
		return fmt.Errorf("delay must be at least 1ms, got %s", d)
	case d%time.Millisecond != 0:
		return fmt.Errorf("delay must be a whole number of milliseconds, got %s", d)
	case z.DelayAfter < 0 || z.DelayAfter > l.Capacity():
		return fmt.Errorf("delay_after must be between 1 and the capacity %d, got %d", l.Capacity(), z.DelayAfter)
	}
	l.Delay, l.DelayAfter = d.Milliseconds(), z.DelayAfter
	if err := l.Validate(); err != nil {
		return fmt.Errorf("delay: %w", err)
	}
	return nil
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
	}{{z.IsConcurrency(), "concurrent"}, {len(z.Count) > 0, "count"}, {z.Penalty > 0, "penalty"}, {z.Delay > 0, "delay"}} {
		if c.set {
			return fmt.Errorf("local_allowance: not with %s (every request of the key must be decided by the store)", c.name)
		}
	}
	return nil
}

// compileCost sets the zone's static cost or its per-request placeholder
// and default.
func (c *Compiled) compileCost(cfg *Zone) error {
	raw, def := strings.TrimSpace(string(cfg.Cost)), cfg.CostDefault
	if def != 0 && !strings.Contains(raw, "{") {
		return errors.New("cost_default applies only to a placeholder cost, such as {cost}")
	}
	if def < 0 {
		return fmt.Errorf("cost_default must be a positive integer, got %d", def)
	}
	if def > c.Limit.Capacity() {
		return fmt.Errorf("cost_default %d exceeds the zone's capacity %d: no request could ever pass", def, c.Limit.Capacity())
	}
	if raw == "" {
		return nil
	}
	if !strings.Contains(raw, "{") {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("cost must be a positive integer or a placeholder, got %q", raw)
		}
		if n > c.Limit.Capacity() {
			return fmt.Errorf("cost %d exceeds the zone's capacity %d: no request could ever pass", n, c.Limit.Capacity())
		}
		c.Cost = n
		return nil
	}
	ph, err := identity.Compile(raw)
	if err != nil {
		return fmt.Errorf("cost: %w", err)
	}
	if ph.Placeholders() == nil {
		return fmt.Errorf("cost must be a positive integer or a placeholder, got %q", raw)
	}
	if err := checkAmount("cost", ph); err != nil {
		return err
	}
	c.CostFrom = &ph
	if def > 0 {
		c.Cost = def
	}
	return nil
}

// dynamicSpec renders the zone's per-request fields of a rate zone (""
// when its limit is static).
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
// static fields are then the defaults, already checked by Limit.
func (c *Compiled) compileDynamic(cfg *Zone) error {
	for _, f := range []struct {
		field, raw string
		dst        **identity.Candidate
	}{
		{"max_events_from", cfg.MaxEventsFrom, &c.EventsFrom},
		{"window_from", cfg.WindowFrom, &c.WindowFrom},
		{"burst_from", cfg.BurstFrom, &c.BurstFrom},
	} {
		raw := strings.TrimSpace(f.raw)
		if raw == "" {
			continue
		}
		ph, err := identity.Compile(raw)
		if err != nil || ph.Placeholders() == nil {
			return fmt.Errorf("%s must be a placeholder, such as {plan_events}, got %q", f.field, raw)
		}
		*f.dst = &ph
	}
	if c.BurstFrom != nil {
		if !c.Limit.Algorithm.AllowsBurst() {
			return fmt.Errorf("burst_from: %s: %w", c.Limit.Algorithm, algorithms.ErrBurstNotAllowed)
		}
		if c.Limit.Burst == 0 {
			return errors.New("burst_from needs a default: set burst too (the burst used when the placeholder's value is unusable)")
		}
	}
	if c.Dynamic() {
		c.DynamicSpec = cfg.dynamicSpec()
	}
	return c.compileConcurrentFrom(cfg)
}

// compileConcurrentFrom compiles a concurrency zone's concurrent_from: its
// slots resolve per request as a rate zone's events do, in one count per
// key.
func (c *Compiled) compileConcurrentFrom(cfg *Zone) error {
	raw := strings.TrimSpace(cfg.ConcurrentFrom)
	if c.Limit.Algorithm != algorithms.Concurrency || raw == "" {
		return nil
	}
	ph, err := identity.Compile(raw)
	if err != nil || ph.Placeholders() == nil {
		return fmt.Errorf("concurrent_from must be a placeholder, such as {plan_concurrent}, got %q", raw)
	}
	c.EventsFrom = &ph
	c.DynamicSpec = "concurrent_from " + raw
	return nil
}
