package sluice

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// A zone's soft mode (`on_exceed pass`): a request the zone would refuse is
// forwarded, and the decision is handed to the next handlers: the
// placeholders {http.rate_limit.exceeded} (true) and {http.rate_limit.zone}
// (with retry_after, limit, remaining and reset, as on a refusal), which
// request_header or reverse_proxy's header_up can pass to the upstream.
// Toward the store the zone is report-only: it never vetoes the request,
// charges nothing when it would refuse (a refusal never consumes), and is
// charged when it allows and the request passes, so its state evolves as
// under enforcement. It is counted (outcome exceeded_passed) and logged
// like a report-only zone's would-be refusal.
//
// The difference from report_only: report_only is for trying a limit out
// (a dry run: decide, record, send the headers, hand nothing on); pass is
// a soft limit in production: the application is told, per request, that
// the client is over, and decides (degrade, bill, warn). An enforcing zone
// of the same request still refuses it.

// on_exceed's actions.
const (
	onExceedRefuse = "refuse"
	onExceedPass   = "pass"
)

// validateZoneModes refuses a zone that is both report_only and on_exceed
// pass: one records, the other hands the decision on. (A report-only
// directive makes its pass zones report-only instead: see compileOutcomes.)
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

// passInfo is the zone a forwarded request would have been refused by.
type passInfo struct {
	zone *zone
	algorithms.Decision
}

// passedOf returns, for an allowed request, the on_exceed pass zone that
// would refuse it with the longest Retry-After, or nil.
func passedOf(s *scratch) *passInfo {
	best := -1
	for i, z := range s.zones {
		if z.pass && !s.decs[i].Allowed && (best < 0 || s.decs[i].RetryAfter > s.decs[best].RetryAfter) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	return &passInfo{zone: s.zones[best], Decision: s.decs[best]}
}

// completeVerdict adds to the verdict of an allowed request what its zones
// leave for later: its post-response step (after.go: the count zones'
// settlement, the concurrency slots to give back), the pass zone it
// exceeded and its wait for its turn.
func (h *Handler) completeVerdict(s *scratch, v *verdict, refused bool) {
	if refused {
		return
	}
	if h.counting || h.concurrent {
		v.after = h.afterOf(s)
	}
	if h.passing {
		v.passed = passedOf(s)
	}
	if h.delaying {
		v.wait = h.waiterOf(s)
	}
}

// markPass publishes, for a directive with an on_exceed pass zone, what the
// next handlers need on every request it lets through: within its limits,
// {http.rate_limit.exceeded} false and {http.rate_limit.zone} empty (known
// values: header_up and request_header would send an unknown placeholder
// as its literal text), unless an earlier directive marked the request
// already; over an on_exceed pass zone (p), the zone and its numbers.
// They are static values, so a later directive overwrites them, and its
// refusal's too (publishPlaceholders, which sees markedByPass).
func (h *Handler) markPass(r *http.Request, p *passInfo, now time.Time) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if p == nil {
		if _, marked := repl.Get(phExceeded); !marked {
			repl.Set(phExceeded, false)
			repl.Set(phZone, "")
			repl.Set(phExceededName, "")
		}
		return
	}
	vars := refusalVars{zone: p.zone.name, retry: h.retryAfterSeconds(p.RetryAfter), limit: p.Limit,
		remaining: p.Remaining, reset: resetUnix(now, p.ResetAfter)}
	for _, ph := range placeholders {
		if ph.pass {
			repl.Set(ph.name, ph.value(vars))
		}
	}
}

// passDirectives counts the provisioned directives with an on_exceed pass
// zone: while there is none, a refusal need not look for their marks.
var passDirectives atomic.Int64

// markedByPass reports whether a directive with an on_exceed pass zone
// marked this request (static values, which a refusal's placeholder
// provider would not override: publishPlaceholders then sets its own as
// static values too).
func markedByPass(repl *caddy.Replacer) bool {
	if passDirectives.Load() == 0 {
		return false
	}
	_, ok := repl.Get(phExceeded)
	return ok
}
