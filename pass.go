package sluice

import (
	"fmt"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/reply"
)

// passControl: a zone's soft mode (`on_exceed pass`). A request the zone
// would refuse is forwarded, marked for the next handlers by the
// placeholders {http.rate_limit.exceeded} and {http.rate_limit.zone} (with
// its numbers, as on a refusal). Toward the store the zone is report-only;
// it is counted (exceeded_passed) and logged like a report-only zone's
// would-be refusal. report_only is a dry run; pass is a soft limit whose
// breach the application is told of, per request.
var passControl = control{
	name:      "on_exceed pass",
	compile:   compileOnExceed,
	provision: provisionPass,
	cleanup: func(h *Handler) {
		if h.passing.on {
			h.passing.on = false
			passDirectives.Add(-1)
		}
	},
	admin: func(z *zone, info *adminZoneInfo) {
		if z.pass.forward {
			info.OnExceed = onExceedPass
		}
	},
	hooks: hooks{verdict: passedOf, serve: markPass},
}

// on_exceed's actions.
const (
	onExceedRefuse = "refuse"
	onExceedPass   = "pass"
)

// validateZoneModes refuses a zone that is both report_only and on_exceed
// pass: one records, the other hands the decision on. (A report-only
// directive makes its pass zones report-only instead: see compileOnExceed.)
func (h *Handler) validateZoneModes() error {
	if h.ReportOnly {
		return nil
	}
	for name, z := range h.RateLimits {
		if z != nil && z.ReportOnly && z.OnExceed == onExceedPass {
			return zoneErr(name, fmt.Errorf("report_only and on_exceed pass: choose one (report_only records would-be refusals; on_exceed pass forwards them marked for the next handlers)"))
		}
	}
	return nil
}

// compileOnExceed compiles what the zone does with a request it would
// refuse.
func compileOnExceed(z *zone, cfg *Zone) error {
	switch cfg.OnExceed {
	case "", onExceedRefuse:
	case onExceedPass:
		// Under a report-only directive, the zone is report-only: nothing
		// is handed on (Handler.Validate refuses both on one zone).
		z.pass.forward = !cfg.ReportOnly
	default:
		return fmt.Errorf("on_exceed: unknown action %q (known: refuse, pass)", cfg.OnExceed)
	}
	return nil
}

// provisionPass sends the pass zones to the store as report-only, and has
// every request the directive lets through marked.
func provisionPass(h *Handler) (stages, error) {
	for i, z := range h.zones {
		if z.pass.forward {
			h.planned[i].ReportOnly = true
			h.passing.on = true
		}
	}
	if !h.passing.on {
		return 0, nil
	}
	passDirectives.Add(1) // cleanup gives it back
	return joins(atVerdict, atServe), nil
}

// passZone is the control's part of a zone: forward says the zone forwards
// a request it would refuse (on_exceed pass), false under report_only.
type passZone struct{ forward bool }

// passDirective is the control's part of a directive: on says a zone of it
// forwards its would-be refusals (counted in passDirectives while so).
type passDirective struct{ on bool }

// passMark is the on_exceed pass zone an allowed request exceeded: its
// position in the admission's zones plus one; 0 for none.
type passMark struct{ at int }

// passedOf notes, for an allowed request, the on_exceed pass zone that
// would refuse it with the longest Retry-After, if any.
func passedOf(a *admission) {
	for i, z := range a.zones {
		if z.pass.forward && !a.decs[i].Allowed && (a.pass.at == 0 || a.decs[i].RetryAfter > a.decs[a.pass.at-1].RetryAfter) {
			a.pass.at = i + 1
		}
	}
}

// markPass publishes, for a directive with an on_exceed pass zone, what the
// next handlers need on every request it lets through: within its limits,
// {http.rate_limit.exceeded} false and {http.rate_limit.zone} empty (known
// values: header_up and request_header would send an unknown placeholder
// as its literal text), unless an earlier directive marked the request
// already; over an on_exceed pass zone, the zone and its numbers. They are
// static values, so a later directive overwrites them, and its refusal's
// too (reply.Publish, which sees markedByPass).
func markPass(a *admission) error {
	repl := a.r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if a.out != allow || a.pass.at == 0 {
		reply.SetWithin(repl)
		return nil
	}
	z, p := a.zones[a.pass.at-1], &a.decs[a.pass.at-1]
	reply.SetPassed(repl, reply.Vars{Zone: z.name, Retry: a.h.resp.RetryAfter(p.RetryAfter), Limit: p.Limit,
		Remaining: p.Remaining, Reset: reply.ResetUnix(a.now, p.ResetAfter)})
	return nil
}

// passDirectives counts the provisioned directives with an on_exceed pass
// zone: while there is none, a refusal need not look for their marks.
var passDirectives atomic.Int64

// markedByPass reports whether a directive with an on_exceed pass zone
// marked this request (static values, which a refusal's placeholder
// provider would not override: reply.Publish then sets its own as
// static values too).
func markedByPass(repl *caddy.Replacer) bool {
	if passDirectives.Load() == 0 {
		return false
	}
	return reply.Marked(repl)
}
