package caddytest_test

import (
	"strconv"
	"testing"
)

// TestPlaceholdersReachWrappingHandlers: the refusal's placeholders are
// readable outside the refusal's own response block, by a handler that
// wraps rate_limit and reads them once the response is written (a deferred
// `header`).
func TestPlaceholdersReachWrappingHandlers(t *testing.T) {
	const tmpl = "{http.rate_limit.zone}/{http.rate_limit.exceeded.name}/{http.rate_limit.retry_after}/{http.rate_limit.limit}/{http.rate_limit.remaining}/{http.rate_limit.status}/{http.rate_limit.error}"
	tc := newTester(t)
	z := zoneName("ph_wrapping")
	load(t, tc, config("", `
http://localhost:@A@ {
	header >X-Refusal "@TMPL@"
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 2
			window 1h
		}
	}
	respond "ok"
}
`, "ZONE", z, "TMPL", tmpl))

	for i := 1; i <= 2; i++ {
		r := expect(t, get(t, tc.Client, siteA+"/"), 200, "allowed")
		// Not refused: the placeholders are unknown, left as they are.
		if got := r.header.Get("X-Refusal"); got != tmpl {
			t.Errorf("allowed request %d: X-Refusal %q, want %q", i, got, tmpl)
		}
	}
	r := expect(t, get(t, tc.Client, siteA+"/"), 429, "refused")
	ra := expectRetryAfter(t, r, 1800-5, 1800, "refused")
	want := z + "/" + z + "/" + strconv.FormatInt(ra, 10) + "/2/0/429/rate limit exceeded"
	if got := r.header.Get("X-Refusal"); got != want {
		t.Errorf("refused: X-Refusal %q, want %q", got, want)
	}
	expectLimitHeaders(t, r, 2, 0, "refused")
}
