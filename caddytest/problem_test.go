package caddytest_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
)

// problem is an RFC 9457 problem details body, with every member kept to
// check that nothing else is sent.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies"`
	all              map[string]any
}

func parseProblem(t *testing.T, r result, what string) problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("%s: Content-Type %q, want application/problem+json", what, ct)
	}
	var p problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("%s: body %q: %v", what, r.body, err)
	}
	_ = json.Unmarshal([]byte(r.body), &p.all)
	if len(p.all) != 5 {
		t.Errorf("%s: members %v, want type, title, status, detail and violated-policies", what, p.all)
	}
	return p
}

// problemSite is a site refusing with `response problem`; @ZONES@ are its
// zones, @STORE@ its store.
const problemSite = `
http://localhost:@A@ {
	rate_limit {
@ZONES@
		headers both
		response problem
@STORE@
	}
	respond "ok"
}
`

func problemZone(name, events, extra string) string {
	return "\t\tzone `" + name + "` {\n\t\t\tkey {client_ip}\n\t\t\tevents " + events + "\n\t\t\twindow 1h\n" + extra + "\t\t}\n"
}

// TestProblemRefusal: `response problem` answers a refusal with the draft
// -11 quota-exceeded problem naming every refusing zone (a zone whose name
// needs escaping too), beside Retry-After, Cache-Control and the -11
// fields, which parse as structured fields.
func TestProblemRefusal(t *testing.T) {
	tc := newTester(t)
	hour, odd, roomy := zoneName("problem_hour"), zoneName(`problem "odd" / zone`), zoneName("problem_roomy")
	load(t, tc, config("", problemSite, "ZONES", problemZone(hour, "1", "")+problemZone(odd, "1", "")+problemZone(roomy, "100", ""), "STORE", ""))

	expect(t, get(t, tc.Client, siteA+"/"), 200, "first")
	r := expect(t, get(t, tc.Client, siteA+"/"), 429, "second")
	p := parseProblem(t, r, "refusal")
	want := []string{hour, odd}
	slices.Sort(want)
	if p.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || p.Title != "Quota Exceeded" ||
		p.Status != 429 || !slices.Equal(p.ViolatedPolicies, want) || !strings.HasPrefix(p.Detail, "rate limit exceeded; retry after ") {
		t.Errorf("problem %+v, want quota-exceeded, 429, violated-policies %q", p, want)
	}
	expectRetryAfter(t, r, 3600-5, 3600, "refusal")
	if r.header.Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control %q", r.header.Get("Cache-Control"))
	}

	// RateLimit-Policy and RateLimit: one String item per zone, q/w and
	// r/t, names percent-decodable to the zones'.
	for _, f := range []string{"RateLimit-Policy", "RateLimit"} {
		l, err := httpsfv.UnmarshalList(r.header.Values(f))
		if err != nil || len(l) != 3 {
			t.Fatalf("%s %q: %v, want 3 members", f, r.header.Values(f), err)
		}
		for _, m := range l {
			it := m.(httpsfv.Item)
			name, _ := url.PathUnescape(it.Value.(string))
			if name != hour && name != odd && name != roomy {
				t.Errorf("%s: member %q is no zone of the site", f, name)
			}
			wantParams := []string{"q", "w"}
			if f == "RateLimit" {
				wantParams = []string{"r", "t"}
			}
			if got := it.Params.Names(); !slices.Equal(got, wantParams) {
				t.Errorf("%s: %q has parameters %v, want %v", f, name, got, wantParams)
			}
			if f == "RateLimit" && name == hour {
				rv, _ := it.Params.Get("r")
				tv, _ := it.Params.Get("t")
				if rv != int64(0) || tv.(int64) < 3600-5 || tv.(int64) > 3600 {
					t.Errorf("RateLimit %q: r=%v t=%v, want r=0 and t about 3600 (the next token)", name, rv, tv)
				}
			}
		}
	}
}

// TestProblemFailClosed: with the store unreachable, a fail-closed zone
// refuses with 503 and the draft's temporary-reduced-capacity problem,
// naming the fail-closed zones (not the fail-open one).
func TestProblemFailClosed(t *testing.T) {
	tc := newTester(t)
	closed, open := zoneName("problem_closed"), zoneName("problem_open")
	load(t, tc, config("", problemSite,
		"ZONES", problemZone(closed, "5", "\t\t\tfail closed\n")+problemZone(open, "5", "\t\t\tfail open\n"),
		"STORE", "\t\tstore redis {\n\t\t\turl redis://127.0.0.1:1\n\t\t\ttimeout 50ms\n\t\t}"))

	start := time.Now()
	r := expect(t, get(t, tc.Client, siteA+"/"), 503, "store down")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the fail-closed refusal took %v", d)
	}
	p := parseProblem(t, r, "fail closed")
	if p.Type != "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity" || p.Title != "Temporary Reduced Capacity" ||
		p.Status != 503 || !slices.Equal(p.ViolatedPolicies, []string{closed}) || p.Detail != "rate limiter unavailable; retry after 1 second" {
		t.Errorf("problem %+v, want temporary-reduced-capacity, 503, violated-policies [%s]", p, closed)
	}
	expectRetryAfter(t, r, 1, 1, "fail closed")
}
