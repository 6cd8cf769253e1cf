package sluice

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/caddy-sluice/identity"
)

// Zone activity for the live page (GET /rate_limit/ui, through GET
// /rate_limit/activity): per zone name, process-wide, counters of the
// decisions and the last refusals as tokens (never raw keys). Counters only
// grow (across config reloads too); the page computes rates from their
// differences. They count what the Prometheus metrics count, and like
// them are off for a handler with disable_metrics (so the simulator, which
// loads its configs that way, never shows on a live page). They cost one
// map lookup and an atomic add per zone decided, and a short lock per
// refusal.

// recentRefusals is how many refusals a zone remembers.
const recentRefusals = 32

type zoneActivity struct {
	allowed, refused, vetoed, reportOnly atomic.Int64

	mu     sync.Mutex
	recent [recentRefusals]refusal // a ring, next is the oldest
	next   int
	n      int
}

// refusal is one remembered refusal (or would-be refusal, report-only).
type refusal struct {
	token      identity.Token
	at         int64 // Unix ms
	retryMs    int64
	reportOnly bool
}

// activity maps zone names to their activity: an immutable snapshot read
// without a lock, copied when a name is added (once per zone name).
var activity struct {
	mu   sync.Mutex
	snap atomic.Pointer[map[string]*zoneActivity]
}

// activityOf returns the activity of a zone name, creating it.
func activityOf(name string) *zoneActivity {
	if m := activity.snap.Load(); m != nil {
		if a := (*m)[name]; a != nil {
			return a
		}
	}
	activity.mu.Lock()
	defer activity.mu.Unlock()
	old := activity.snap.Load()
	if old != nil {
		if a := (*old)[name]; a != nil {
			return a
		}
	}
	m := make(map[string]*zoneActivity, 1+len(ptrActivity(old)))
	for k, v := range ptrActivity(old) {
		m[k] = v
	}
	a := new(zoneActivity)
	m[name] = a
	activity.snap.Store(&m)
	return a
}

func ptrActivity(m *map[string]*zoneActivity) map[string]*zoneActivity {
	if m == nil {
		return nil
	}
	return *m
}

// recordActivity counts the zones of a decided request (refused: some
// enforcing zone refused it), as countDecisions does for the metrics.
func recordActivity(s *scratch, refused bool) {
	var now int64
	for i, z := range s.zones {
		a := activityOf(z.name)
		deny := !s.decs[i].Allowed
		switch {
		case deny && s.reqs[i].ReportOnly:
			a.reportOnly.Add(1)
		case !refused:
			a.allowed.Add(1)
			continue
		case deny:
			a.refused.Add(1)
		default:
			a.vetoed.Add(1)
			continue
		}
		if now == 0 {
			now = time.Now().UnixMilli()
		}
		a.remember(refusal{token: identity.Token(s.reqs[i].Key), at: now, retryMs: s.decs[i].RetryAfter.Milliseconds(), reportOnly: s.reqs[i].ReportOnly})
	}
}

func (a *zoneActivity) remember(r refusal) {
	a.mu.Lock()
	a.recent[a.next] = r
	a.next = (a.next + 1) % recentRefusals
	a.n = min(a.n+1, recentRefusals)
	a.mu.Unlock()
}

// last returns the remembered refusals, newest first.
func (a *zoneActivity) last() []refusal {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]refusal, 0, a.n)
	for i := 1; i <= a.n; i++ {
		out = append(out, a.recent[(a.next-i+recentRefusals)%recentRefusals])
	}
	return out
}
