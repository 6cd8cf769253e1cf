package caddytest_test

import (
	"net/url"
	"strconv"
	"testing"

	"github.com/dunglas/httpsfv"
)

// twoDirectivesSite is a route with two rate_limit directives: one on the
// client IP (@IPEVENTS@ per hour), one on the account (1000 per hour), in
// the order given by @FIRST@ and @SECOND@.
const twoDirectivesSite = `
http://localhost:@A@ {
	route /account/* {
@FIRST@
@SECOND@
		respond "ok"
	}
}
`

func directive(zone, key, events, headers string) string {
	return "\t\trate_limit {\n\t\t\tzone " + zone + " {\n\t\t\t\tkey " + key + "\n\t\t\t\tevents " + events +
		"\n\t\t\t\twindow 1h\n\t\t\t}\n\t\t\theaders " + headers + "\n\t\t}"
}

// draftRemaining returns each zone's r in the RateLimit field, failing the
// test unless the field is one structured field list.
func draftRemaining(t *testing.T, r result) map[string]int64 {
	t.Helper()
	vals := r.header.Values("RateLimit")
	if len(vals) != 1 {
		t.Errorf("RateLimit %q: want one field value", vals)
	}
	l, err := httpsfv.UnmarshalList(vals)
	if err != nil {
		t.Fatalf("RateLimit %q: %v", vals, err)
	}
	out := map[string]int64{}
	for _, m := range l {
		it := m.(httpsfv.Item)
		name, _ := url.PathUnescape(it.Value.(string))
		rv, _ := it.Params.Get("r")
		out[name], _ = rv.(int64)
	}
	return out
}

// TestTwoDirectivesOneRequest: a per-IP directive (10 per hour) and a
// per-account directive (1000 per hour) in one route report, in either
// order, the binding per-IP limit in X-RateLimit-* (while both allow, and
// when the per-IP one refuses), and both zones in the draft fields.
func TestTwoDirectivesOneRequest(t *testing.T) {
	tc := newTester(t)
	for _, mode := range []string{"legacy", "both", "draft"} {
		for _, ipFirst := range []bool{true, false} {
			ip, acct := zoneName("per_ip"), zoneName("per_account")
			ipDir := directive(ip, "{client_ip}", "10", mode)
			acctDir := directive(acct, "{http.request.header.X-Account}", "1000", mode)
			first, second := ipDir, acctDir
			if !ipFirst {
				first, second = acctDir, ipDir
			}
			what := mode + ", per-IP first " + strconv.FormatBool(ipFirst)
			load(t, tc, config("", twoDirectivesSite, "FIRST", first, "SECOND", second))
			legacy, draft := mode != "draft", mode != "legacy"

			for i := int64(1); i <= 11; i++ {
				what := what + ", request " + strconv.FormatInt(i, 10)
				r := get(t, tc.Client, siteA+"/account/me", "X-Account: acct-"+nonce)
				if i <= 10 {
					expect(t, r, 200, what)
				} else {
					expect(t, r, 429, what)
					expectRetryAfter(t, r, 360-5, 360, what) // one per-IP token in 6 minutes
				}
				if legacy {
					expectLimitHeaders(t, r, 10, max(10-i, 0), what)
				} else {
					expectNoLegacy(t, r, what)
				}
				if !draft {
					continue
				}
				got := draftRemaining(t, r)
				acctLeft, acctListed := 1000-min(i, 10), true
				if i == 11 {
					if ipFirst {
						acctListed = false // refused before the account directive ran
					} else {
						acctLeft = 1000 - 11 // charged by the first directive
					}
				}
				if got[ip] != max(10-i, 0) || len(got) != map[bool]int{true: 2, false: 1}[acctListed] || acctListed && got[acct] != acctLeft {
					t.Errorf("%s: RateLimit r by zone %v, want %s=%d and %s=%d (listed %v)", what, got, ip, max(10-i, 0), acct, acctLeft, acctListed)
				}
			}
		}
	}
}

func expectNoLegacy(t *testing.T, r result, what string) {
	t.Helper()
	for _, h := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
		if v := r.header.Values(h); len(v) != 0 {
			t.Errorf("%s: %s %q with headers draft", what, h, v)
		}
	}
}
