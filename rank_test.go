package sluice

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/admin"
	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/reply"
)

// TestRankingAgrees runs one table of decision pairs through the three
// places that show the most constrained zone: the verdict of one directive
// (admission.verdict), the rate limit headers of a later directive (priorLegacyWins) and
// the admin API's peek (admin.MostConstrained). They must choose the same one.
func TestRankingAgrees(t *testing.T) {
	allowed := func(rem, reset int64) algorithms.Decision {
		return algorithms.Decision{Allowed: true, Limit: 10, Remaining: rem, ResetAfter: time.Duration(reset) * time.Second}
	}
	refused := func(rem, retry, reset int64) algorithms.Decision {
		return algorithms.Decision{Limit: 10, Remaining: rem, RetryAfter: time.Duration(retry) * time.Second, ResetAfter: time.Duration(reset) * time.Second}
	}
	cases := []struct {
		name string
		a, b algorithms.Decision
		want int // 0: a, 1: b
	}{
		{"allowed: least remaining", allowed(5, 10), allowed(3, 5), 1},
		{"allowed: least remaining, first", allowed(2, 1), allowed(3, 9), 0},
		{"allowed: equal remaining, later reset", allowed(3, 5), allowed(3, 9), 1},
		{"allowed: equals, the first", allowed(3, 5), allowed(3, 5), 0},
		{"a refusal beats an allowed zone", refused(0, 3, 3), allowed(0, 20), 0},
		{"a refusal beats an allowed zone, second", allowed(0, 20), refused(0, 1, 1), 1},
		{"refusals: longer Retry-After", refused(0, 2, 2), refused(0, 5, 5), 1},
		{"refusals: longer Retry-After despite reset", refused(0, 6, 6), refused(0, 2, 10), 0},
		{"refusals: equal Retry-After, the first", refused(0, 4, 4), refused(0, 4, 8), 0},
		{"refusals: Retry-After before remaining", refused(3, 2, 2), refused(0, 1, 9), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pair := []algorithms.Decision{c.a, c.b}
			// The refusal and the headers of one directive.
			zones := []*zone{{name: "a"}, {name: "b"}}
			a := &admission{h: &Handler{}, out: decided, reqs: make([]algorithms.Request, 2), decs: pair, zones: zones, shown: make([]*shownLimit, 2)}
			a.verdict()
			if v := a.v; v.zone != zones[c.want] {
				t.Errorf("the verdict chose %s, want %s", v.zone.name, zones[c.want].name)
			}
			// A later directive's headers, a having decided first.
			h := http.Header{}
			h.Set(reply.HeaderRemaining, strconv.FormatInt(c.a.Remaining, 10))
			h.Set(reply.HeaderReset, strconv.FormatInt(int64(c.a.ResetAfter/time.Second), 10))
			if !c.a.Allowed {
				h.Set(reply.HeaderRetryAfter, strconv.FormatInt(int64(c.a.RetryAfter/time.Second), 10))
			}
			got := 1
			if reply.PriorLegacyWins(h, !c.b.Allowed, int64(c.b.RetryAfter/time.Second), c.b.Remaining, int64(c.b.ResetAfter/time.Second)) {
				got = 0
			}
			if got != c.want {
				t.Errorf("headers chose %d, want %d", got, c.want)
			}
			// The admin API's peek of a key's tokens.
			if got := admin.MostConstrained(pair, []bool{true, true}); got != c.want {
				t.Errorf("admin peek chose %d, want %d", got, c.want)
			}
		})
	}
}
