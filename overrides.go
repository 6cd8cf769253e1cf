package sluice

import (
	"strconv"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/telemetry"
)

// The root's side of overrides (a key's limit set at runtime through the
// admin API, kept and applied by the store: package admin's overrides.go,
// stores.Overrider): the metric of those in force, and what a response
// shows of an overridden limit.

// overridesInForce returns what package admin tells the count of zone's
// overrides in force to: the zone's gauge.
func overridesInForce(zone string) func(int) {
	return func(n int) {
		if g := telemetry.Metrics.Overrides; g != nil {
			g.WithLabelValues(zone).Set(float64(n))
		}
	}
}

// overriddenShown is what a response shows of a limit an override set
// (d: the decision under it): X-RateLimit-Limit its capacity (0: blocked);
// the draft's RateLimit-Policy keeps the zone's policy. Formatted per
// response: overridden requests are few.
func overriddenShown(base *shownLimit, d *algorithms.Decision) *shownLimit {
	return &shownLimit{limit: strconv.FormatInt(d.Limit, 10), policy: base.policy}
}
