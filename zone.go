package sluice

import (
	"fmt"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/internal/zonename"
	"github.com/sluicehq/caddy-sluice/reply"
	"github.com/sluicehq/caddy-sluice/telemetry"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// zone is a Zone compiled at Provision (compileZone): the hot path parses
// nothing.
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
	// giver is the control whose charges the zone's are (set by its
	// compile): what giving one back means (reservation.go); nil: a rate
	// charge.
	giver giver
	// conc is a concurrency zone's run time (concurrency.go); nil for a
	// rate zone.
	conc *concurrencyZone
	// adapt is an adaptive concurrency zone's (adaptive.go); nil otherwise.
	adapt *adaptiveZone
	// badValue rate-limits the log line about unusable per-request values
	// (cost, events, window, burst); nil when nothing is chosen per request.
	badValue *telemetry.SampledLog
	// shown is what responses show of the zone's default limit.
	shown shownLimit
	// metrics are the zone's counters; nil with disable_metrics.
	metrics    *telemetry.ZoneMetrics
	reportOnly bool
	// count is a count zone's (count.go); nil: every response charged.
	count *countZone
	// settle is where the zone reads the actual amount (settle.go); nil:
	// none.
	settle *settleZone
	// The controls' state of the zone, one slot each: requestjson.go's,
	// pass.go's.
	requestJSON requestJSONZone
	pass        passZone
	// allowance is the zone's local allowance (nil: none), given to the
	// store at Provision.
	allowance *LocalAllowance
	// sync is the zone's asynchronous mode (sync.go).
	sync syncZone
	// maxOverrides bounds the zone's overrides (admin.Zone.MaxOverrides).
	maxOverrides int
	// The name as each sink carries it (see setNames): JSON-escaped (without
	// the quotes), the policy identifier of the IETF RateLimit fields, that
	// identifier as a serialised sf-string and as a JSON string (both with
	// their quotes).
	jsonName, policyID, sfName, jsonPolicyID string
}

// setNames fills in the forms of z's name each sink carries.
func (z *zone) setNames() {
	z.jsonName = reply.JSONEscape(z.name)
	z.policyID = zonename.Policy(z.name)
	z.sfName = reply.SFString(z.policyID)
	z.jsonPolicyID = `"` + reply.JSONEscape(z.policyID) + `"`
}

// compileZone checks a zone's configuration (defaults set) and builds its
// runtime form from the zone model; the errors name the field (the caller
// names the zone). Matchers are loaded by the caller.
func compileZone(cfg *Zone, name string) (*zone, error) {
	m, err := cfg.Compile(name)
	if err != nil {
		return nil, err
	}
	zn := &zone{name: name, limit: m.Limit, cost: m.Cost, costExpr: m.CostFrom, deriver: m.Deriver, fail: m.Fail,
		reportOnly: m.ReportOnly, allowance: m.Allowance, maxOverrides: m.MaxOverrides}
	zn.setNames()
	zn.shown = zn.showLimit(m.Limit)
	if m.Dynamic() {
		zn.dyn = &dynamicLimit{events: m.EventsFrom, window: m.WindowFrom, burst: m.BurstFrom}
	}
	zn.dynSpec = m.DynamicSpec // also an adaptive zone's settings
	if err := compileControls(zn, cfg); err != nil {
		return nil, err
	}
	if zn.costExpr != nil || zn.dyn != nil {
		zn.badValue = telemetry.NewSampledLog(1, telemetry.BadValueInterval)
	}
	return zn, nil
}

// A zone's configuration, its defaults and its checks live in zonemodel,
// which `caddy rate-limit simulate` reads too; the handler's runtime zone
// (above) is built from zonemodel.Compiled.

// Zone is one zone's configuration (Handler.RateLimits): zonemodel.Zone.
type Zone = zonemodel.Zone

// LocalAllowance is a zone's local allowance (Zone.LocalAllowance).
type LocalAllowance = zonemodel.LocalAllowance

// KeyCandidates is a zone's key candidates (Zone.Key).
type KeyCandidates = zonemodel.KeyCandidates

// Fail policies, and the longest zone name.
const (
	failOpenPolicy   = zonemodel.FailOpen
	failClosedPolicy = zonemodel.FailClosed
	failLocalPolicy  = zonemodel.FailLocal
	maxZoneNameLen   = zonemodel.MaxNameLen
)

// zoneErr names the zone in err: quoted (a name may hold spaces or quotes),
// and cut short if it is too long to be a name.
func zoneErr(name string, err error) error {
	if len(name) > maxZoneNameLen {
		return fmt.Errorf("zone %.40q...: %w", name, err)
	}
	return fmt.Errorf("zone %q: %w", name, err)
}

// Settle is a zone's settle source (Zone.Settle).
type Settle = zonemodel.Settle
