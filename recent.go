package sluice

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/caddy-sluice/identity"
)

// Zone activity for the live page (rate_limit_ui, through its activity
// JSON, also GET /rate_limit/activity on the admin API): per zone name, process-wide, counters of the
// decisions and the keys refused last, as tokens (never raw keys), each
// once with its count. Counters only
// grow (across config reloads too); the page computes rates from their
// differences. They count what the Prometheus metrics count, and like
// them are off for a handler with disable_metrics (so the simulator, which
// loads its configs that way, never shows on a live page). They cost one
// map lookup and an atomic add per zone decided, and a short lock per
// refusal.

// recentKeys is how many refused keys a zone remembers.
const recentKeys = 32

type zoneActivity struct {
	allowed, refused, vetoed, reportOnly atomic.Int64

	mu   sync.Mutex
	keys [recentKeys]refusedKey // the first n are in use, in no order
	n    int
}

// refusedKey is a key refused recently: its refusals since it was
// remembered and the last one's details. A key refused again is updated in
// place; a new key replaces the one refused longest ago once the table is
// full.
type refusedKey struct {
	token      identity.Token
	count      int64
	at         int64 // Unix ms of the last refusal
	retryMs    int64
	reportOnly bool // a would-be refusal of a report-only zone
	passed     bool // a refusal forwarded by on_exceed pass
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
func recordActivity(s *admission, refused bool) {
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
		a.remember(identity.Token(s.reqs[i].Key), now, s.decs[i].RetryAfter.Milliseconds(), s.reqs[i].ReportOnly && !z.pass.forward, z.pass.forward)
	}
}

// remember records a refusal of tok.
func (a *zoneActivity) remember(tok identity.Token, at, retryMs int64, reportOnly, passed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i, oldest := 0, 0
	for ; i < a.n && a.keys[i].token != tok; i++ {
		if a.keys[i].at < a.keys[oldest].at {
			oldest = i
		}
	}
	switch {
	case i < a.n: // known: counted again
	case a.n < recentKeys:
		a.n++
		a.keys[i] = refusedKey{token: tok}
	default:
		i = oldest
		a.keys[i] = refusedKey{token: tok}
	}
	k := &a.keys[i]
	k.count++
	k.at, k.retryMs, k.reportOnly, k.passed = at, retryMs, reportOnly, passed
}

// last returns the remembered keys, refused most recently first.
func (a *zoneActivity) last() []refusedKey {
	a.mu.Lock()
	out := slices.Clone(a.keys[:a.n])
	a.mu.Unlock()
	slices.SortFunc(out, func(x, y refusedKey) int { return cmp.Compare(y.at, x.at) })
	return out
}
