package zonemodel

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/adaptive"
	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Adaptive makes a zone an adaptive concurrency zone (Zone.Adaptive): the
// requests of one key in flight at once are limited to a limit this
// instance learns from the upstream's latency. docs/adaptive.md says how
// each controller learns and how the defaults were measured.
type Adaptive struct {
	// Controller is how the limit is learnt: "aimd" (grow by one while the
	// latency stays within tolerance × its baseline, cut to 0.8 of itself
	// past it), "gradient2" or "vegas" (Netflix's concurrency-limits). Default:
	// "aimd".
	Controller string `json:"controller,omitempty"`

	// Minimum is the least the limit falls to, 1 to 1000000. Default: 2.
	Minimum int64 `json:"minimum,omitempty"`

	// Maximum is the most the limit grows to, from Minimum to 1000000.
	// Minimum = Maximum fixes the limit. Default: 1000 (at least Minimum).
	Maximum int64 `json:"maximum,omitempty"`

	// Initial is the limit before anything is learnt, between Minimum and
	// Maximum. Default: 20, within the bounds.
	Initial int64 `json:"initial,omitempty"`

	// Tolerance is how far the latency may grow over its baseline: aimd
	// backs off past tolerance × baseline; gradient2's gradient is
	// tolerance × baseline / latency. 1 to 10. Default: 1.1 (gradient2: 1.5).
	Tolerance float64 `json:"tolerance,omitempty"`

	// Smoothing weighs each new gradient2 limit against the last, above 0
	// and at most 1. Default: 0.2.
	Smoothing float64 `json:"smoothing,omitempty"`

	// Window is the least time one window of latency samples spans (and
	// at least 10 samples); the limit moves once per window. 1ms to 1m.
	// Default: 100ms.
	Window caddy.Duration `json:"window,omitempty"`
}

// Settings returns the controller settings a's fields give, resolved and
// checked; the errors name the field.
func (a *Adaptive) Settings() (adaptive.Settings, error) {
	return adaptive.Settings{Controller: a.Controller, Minimum: a.Minimum, Maximum: a.Maximum, Initial: a.Initial,
		Tolerance: a.Tolerance, Smoothing: a.Smoothing, Window: time.Duration(a.Window)}.Resolve()
}

// adaptiveLimit compiles an adaptive zone's limit: a concurrency limit at
// its initial value (the learnt one is set per request), checking the
// fields that do not apply.
func (z *Zone) adaptiveLimit() (algorithms.Limit, error) {
	for _, f := range append(z.rateFields(),
		fieldSet{"concurrent <n>", z.Concurrent != 0}, fieldSet{"concurrent_from", z.ConcurrentFrom != ""}, fieldSet{"lease", z.Lease != 0},
		fieldSet{"count", len(z.Count) > 0}, fieldSet{"penalty", z.Penalty != 0}, fieldSet{"delay_after", z.DelayAfter != 0},
		fieldSet{"on_exceed", z.OnExceed != "" && z.OnExceed != "refuse"}, fieldSet{"local_allowance", z.LocalAllowance != nil},
	) {
		if f.set {
			return algorithms.Limit{}, fmt.Errorf("%s does not apply to an adaptive concurrency zone (concurrent adaptive): its limit is learnt from the upstream's latency; put a rate in a zone of its own", f.name)
		}
	}
	if z.Fail != "" && z.Fail != FailOpen {
		return algorithms.Limit{}, errors.New("fail does not apply to an adaptive concurrency zone (concurrent adaptive): it is decided in this instance's memory and never asks the store")
	}
	s, err := z.Adaptive.Settings()
	if err != nil {
		return algorithms.Limit{}, fmt.Errorf("adaptive: %w", err)
	}
	if d := time.Duration(z.Delay); d < 0 || d%time.Millisecond != 0 {
		return algorithms.Limit{}, fmt.Errorf("delay must be a whole number of milliseconds, got %s", d)
	}
	return algorithms.NewConcurrencyLimit(s.Initial, DefaultLease)
}

// compileAdaptive sets an adaptive zone's compiled settings; nothing for
// another zone.
func (c *Compiled) compileAdaptive(cfg *Zone) error {
	if cfg.Adaptive == nil {
		return nil
	}
	s, err := cfg.Adaptive.Settings()
	if err != nil {
		return fmt.Errorf("adaptive: %w", err)
	}
	c.Adaptive, c.AdaptiveWait = &s, time.Duration(cfg.Delay)
	c.DynamicSpec = describeAdaptive(s, c.AdaptiveWait)
	return nil
}

// describeAdaptive renders an adaptive zone's settings as the Caddyfile
// would write them, for the check that one zone name carries one limit.
func describeAdaptive(s adaptive.Settings, wait time.Duration) string {
	d := "concurrent adaptive { controller " + s.Controller + " minimum " + strconv.FormatInt(s.Minimum, 10) +
		" maximum " + strconv.FormatInt(s.Maximum, 10) + " initial " + strconv.FormatInt(s.Initial, 10) +
		" tolerance " + strconv.FormatFloat(s.Tolerance, 'g', -1, 64) + " smoothing " + strconv.FormatFloat(s.Smoothing, 'g', -1, 64) +
		" window " + s.Window.String() + " }"
	if wait > 0 {
		d += " delay " + wait.String()
	}
	return d
}
