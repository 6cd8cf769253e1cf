package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dunglas/httpsfv"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// draftMember is one zone's member of RateLimit-Policy or RateLimit, every
// parameter by name.
type draftMember map[string]any

// parseDraft11 parses both fields with httpsfv and returns each zone's
// members by policy name; it fails on anything draft-11 does not allow: a
// member that is not a String item, a parameter the draft does not define
// without a vendor prefix, a value of the wrong type.
func parseDraft11(t *testing.T, hdr http.Header) (policy, state map[string]draftMember) {
	t.Helper()
	known := map[string]map[string]bool{
		"RateLimit-Policy": {"q": true, "qu": true, "w": true, "pk": true},
		"RateLimit":        {"r": true, "t": true, "pk": true},
	}
	parse := func(field string) map[string]draftMember {
		l, err := httpsfv.UnmarshalList(hdr.Values(field))
		if err != nil {
			t.Fatalf("%s %q: %v", field, hdr.Values(field), err)
		}
		out := map[string]draftMember{}
		for _, m := range l {
			it, ok := m.(httpsfv.Item)
			name, isStr := it.Value.(string)
			if !ok || !isStr {
				t.Fatalf("%s %q: member %v is not a String item", field, hdr.Values(field), m)
			}
			mem := draftMember{}
			for _, k := range it.Params.Names() {
				v, _ := it.Params.Get(k)
				if !known[field][k] && !strings.HasPrefix(k, "sluice-") {
					t.Errorf("%s %q: parameter %q is neither the draft's nor vendor-prefixed", field, hdr.Values(field), k)
				}
				switch k {
				case "q", "w", "r", "t":
					n, ok := v.(int64)
					if !ok || n < 0 || k == "w" && n == 0 {
						t.Errorf("%s: %s=%v, want a non-negative Integer (w: non-zero)", field, k, v)
					}
				case "qu":
					if _, ok := v.(string); !ok {
						t.Errorf("%s: qu=%v, want a String", field, v)
					}
				}
				mem[k] = v
			}
			out[name] = mem
		}
		return out
	}
	return parse("RateLimit-Policy"), parse("RateLimit")
}

// expectMember checks a member's parameters exactly (absent: nil).
func expectMember(t *testing.T, what string, got, want draftMember) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %v, want %v", what, got, want)
		return
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %s=%v, want %v (all: %v, want %v)", what, k, got[k], w, got, want)
		}
	}
}

// TestDraft11TokenBucket: on a token bucket at known instants, q and w are
// the policy (events per window), r what is left, and t the effective
// window: the seconds (rounded up) within which the client can use no more
// than r, that is until the next token. A full bucket's t is one token's
// refill; a refusal's t is within its Retry-After.
func TestDraft11TokenBucket(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone d11_tb {
			key {http.request.header.X-User}
			events 10
			window 1h
		}
		headers draft
	}`, clock)
	h.logger = zap.NewNop()
	user := map[string]string{"X-User": "tb"}
	pol := draftMember{"q": int64(10), "w": int64(3600)}
	step := func(what string, code int, r, tt int64) {
		t.Helper()
		w := serve(t, h, "GET", "/", user)
		if w.Code != code {
			t.Fatalf("%s: status %d, want %d", what, w.Code, code)
		}
		p, s := parseDraft11(t, w.Header())
		expectMember(t, what+": RateLimit-Policy", p["d11_tb"], pol)
		expectMember(t, what+": RateLimit", s["d11_tb"], draftMember{"r": r, "t": tt})
		if code == 429 {
			if ra, _ := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64); ra < tt {
				t.Errorf("%s: Retry-After %d ends before the effective window t=%d", what, ra, tt)
			}
		}
	}
	// One token per 360 s.
	step("first", 200, 9, 360)
	clock.add(100_000) // 100 s: the first token is 260 s from back
	step("second", 200, 8, 260)
	for i := 3; i <= 10; i++ {
		step("request "+strconv.Itoa(i), 200, int64(10-i), 260)
	}
	step("refused", 429, 0, 260)
	clock.add(259_500) // 500 ms before the next token
	step("refused, almost", 429, 0, 1)
	clock.add(500)
	step("the token", 200, 0, 360)
	clock.add(3600_000) // back to full; the request spends one
	step("an hour later", 200, 9, 360)
}

// TestDraft11TokenBucketBurst: with a burst, q and w still describe the
// rate (events per window) and r counts up to the burst; t is the next
// token's refill. A full bucket (here: vetoed by another zone, so not
// charged) has t of one token: spending all r now, no more comes sooner.
func TestDraft11TokenBucketBurst(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone d11_burst {
			key {http.request.header.X-User}
			events 60
			window 1m
			burst 5
		}
		zone d11_veto {
			key {http.request.header.X-User}
			events 1
			window 1m
			cost {http.request.header.X-Cost} 1
		}
		headers draft
	}`, clock)
	h.logger = zap.NewNop()
	w := serve(t, h, "GET", "/", map[string]string{"X-User": "b"})
	p, s := parseDraft11(t, w.Header())
	expectMember(t, "policy", p["d11_burst"], draftMember{"q": int64(60), "w": int64(60)})
	expectMember(t, "state", s["d11_burst"], draftMember{"r": int64(4), "t": int64(1)})

	w = serve(t, h, "GET", "/", map[string]string{"X-User": "full", "X-Cost": "2"})
	if w.Code != 429 {
		t.Fatalf("cost 2 over capacity 1: %d", w.Code)
	}
	_, s = parseDraft11(t, w.Header())
	expectMember(t, "full bucket", s["d11_burst"], draftMember{"r": int64(5), "t": int64(1)})
}

// TestDraft11FixedWindow: on a fixed window (aligned to the minute) the
// effective window is the rest of the current window: the client can use
// no more than r until it ends, rounded up to whole seconds.
func TestDraft11FixedWindow(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000} // a whole minute
	h := newHandler(t, `rate_limit {
		zone d11_fw {
			key {http.request.header.X-User}
			events 3
			window 1m
			algorithm fixed_window
		}
		headers draft
	}`, clock)
	h.logger = zap.NewNop()
	user := map[string]string{"X-User": "fw"}
	step := func(what string, code int, r, tt int64) {
		t.Helper()
		w := serve(t, h, "GET", "/", user)
		if w.Code != code {
			t.Fatalf("%s: status %d, want %d", what, w.Code, code)
		}
		p, s := parseDraft11(t, w.Header())
		expectMember(t, what+": RateLimit-Policy", p["d11_fw"], draftMember{"q": int64(3), "w": int64(60)})
		expectMember(t, what+": RateLimit", s["d11_fw"], draftMember{"r": r, "t": tt})
	}
	step("first", 200, 2, 60)
	clock.add(15_500)
	step("second", 200, 1, 45) // 44.5 s left, rounded up
	clock.add(30_000)
	step("third", 200, 0, 15)
	step("refused", 429, 0, 15)
	clock.add(14_500)
	step("next window", 200, 2, 60)
}

// TestDraft11Units: q and r count requests. A static cost converts them
// (capacity 10, cost 3: 3 requests, the 4th's 1 unit not enough); t is
// then the time until one more request's worth. A per-request cost counts
// cost units, which no registered quota unit names: the policy says so
// with a vendor parameter.
func TestDraft11Units(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone d11_cost3 {
			key {http.request.header.X-User}
			events 10
			window 100s
			cost 3
		}
		zone d11_costdyn {
			key {http.request.header.X-User}
			events 10
			window 100s
			cost {http.request.header.X-Cost} 1
		}
		headers draft
	}`, clock)
	w := serve(t, h, "GET", "/", map[string]string{"X-User": "u", "X-Cost": "2"})
	p, s := parseDraft11(t, w.Header())
	expectMember(t, "static cost policy", p["d11_cost3"], draftMember{"q": int64(3), "w": int64(100)})
	// 7 units left: 2 requests; a third needs 9 units, 2 more at 10 s
	// each.
	expectMember(t, "static cost state", s["d11_cost3"], draftMember{"r": int64(2), "t": int64(20)})
	expectMember(t, "per-request cost policy", p["d11_costdyn"], draftMember{"q": int64(10), "w": int64(100), "sluice-qu": "cost"})
	expectMember(t, "per-request cost state", s["d11_costdyn"], draftMember{"r": int64(8), "t": int64(10)})
}

// failingStore fails every decision, as an unreachable shared store does.
type failingStore struct{}

func (failingStore) Take(context.Context, []algorithms.Request, []algorithms.Decision) error {
	return errors.New("store down")
}

// problemBody is an RFC 9457 problem details object.
type problemBody struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies"`
}

const (
	typeQuotaExceeded   = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	typeReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

// TestProblemResponse: `response problem` refuses with the draft's
// quota-exceeded problem (429) naming every refusing zone, and a
// fail-closed refusal with temporary-reduced-capacity (503) naming the
// fail-closed zones.
func TestProblemResponse(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	block := `rate_limit {
		zone pb_a {
			key {http.request.header.X-User}
			events 1
			window 1h
			fail closed
		}
		zone "pb b/\"x\"" {
			key {http.request.header.X-User}
			events 1
			window 1m
			fail closed
		}
		zone pb_roomy {
			key {http.request.header.X-User}
			events 100
			window 1h
		}
		response problem
	}`
	h := newHandler(t, block, clock)
	h.logger = zap.NewNop()
	user := map[string]string{"X-User": "p"}
	serve(t, h, "GET", "/", user)
	w := serve(t, h, "GET", "/", user)
	var pb problemBody
	if w.Code != 429 || w.Header().Get("Content-Type") != "application/problem+json" || json.Unmarshal(w.Body.Bytes(), &pb) != nil {
		t.Fatalf("refusal: %d %q %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	want := problemBody{Type: typeQuotaExceeded, Title: "Quota Exceeded", Status: 429,
		Detail: "rate limit exceeded; retry after 3600 seconds", ViolatedPolicies: []string{"pb b/\"x\"", "pb_a"}}
	if pb.Type != want.Type || pb.Title != want.Title || pb.Status != want.Status || pb.Detail != want.Detail ||
		strings.Join(pb.ViolatedPolicies, "|") != strings.Join(want.ViolatedPolicies, "|") {
		t.Errorf("problem %+v\nwant    %+v\n(%s)", pb, want, w.Body)
	}
	if cl := w.Header().Get("Content-Length"); cl != "" && cl != strconv.Itoa(w.Body.Len()) || w.Header().Get("Retry-After") != "3600" {
		t.Errorf("headers %v", w.Header())
	}

	useStores(h, failingStore{}, nil)
	w = serve(t, h, "GET", "/", user)
	pb = problemBody{}
	if w.Code != 503 || w.Header().Get("Content-Type") != "application/problem+json" || json.Unmarshal(w.Body.Bytes(), &pb) != nil {
		t.Fatalf("fail closed: %d %q %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	want = problemBody{Type: typeReducedCapacity, Title: "Temporary Reduced Capacity", Status: 503,
		Detail: "rate limiter unavailable; retry after 1 second", ViolatedPolicies: []string{"pb b/\"x\"", "pb_a"}}
	if pb.Type != want.Type || pb.Title != want.Title || pb.Status != want.Status || pb.Detail != want.Detail ||
		strings.Join(pb.ViolatedPolicies, "|") != strings.Join(want.ViolatedPolicies, "|") {
		t.Errorf("fail closed: problem %+v\nwant    %+v\n(%s)", pb, want, w.Body)
	}
}

// TestProblemConfig: `response problem` takes status and header, and not
// the settings the problem defines itself (refused by the grammar or at
// load).
func TestProblemConfig(t *testing.T) {
	parse := func(resp string) (*Handler, error) {
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("rate_limit {\n\tzone z {\n\t\tevents 1\n\t\twindow 1m\n\t}\n\t" + resp + "\n}"))
		if err == nil {
			err = h.Validate()
		}
		return h, err
	}
	h, err := parse("response problem")
	if err != nil || h.Response == nil || !h.Response.Problem {
		t.Fatalf("response problem: %+v %v", h.Response, err)
	}
	h, err = parse("response problem {\n\t\tstatus 420\n\t\theader X-A b\n\t}")
	if err != nil || !h.Response.Problem || h.Response.StatusCode != 420 || h.Response.Headers.Get("X-A") != "b" {
		t.Fatalf("response problem with a block: %+v %v", h.Response, err)
	}
	for _, bad := range []string{"response problem {\n\t\tbody x\n\t}", "response problem {\n\t\tcontent_type text/plain\n\t}", "response problem extra"} {
		if _, err := parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for _, js := range []string{`{"problem":true,"body":"x"}`, `{"problem":true,"handle_errors":true}`, `{"problem":true,"content_type":"a/b"}`} {
		var r Response
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			t.Fatal(err)
		}
		if err := r.Validate(); err == nil {
			t.Errorf("%s: accepted", js)
		}
	}
}

// TestProblemRefusalAllocations pins what a `response problem` refusal
// allocates: the default refusal's three (TestRefusalAllocations) and the
// violated-policies list.
func TestProblemRefusalAllocations(t *testing.T) {
	if raceBuild() {
		t.Skip("under -race, sync.Pool drops some of what it is given: the counts are not the program's")
	}
	l := newLoop(t, `rate_limit {
		zone allocs_problem {
			key static
			events 1
			window 1h
		}
		response problem
	}`, okHandler)
	n := testing.AllocsPerRun(1000, func() {
		if err := l.serve(t); err != nil || l.w.status != 429 {
			t.Fatalf("status %d, err %v", l.w.status, err)
		}
	})
	t.Logf("allocations per problem refusal: %v", n)
	if n != 4 {
		t.Errorf("problem refusal: %v allocations, want 4", n)
	}
	// (The wait is the real clock's: 3600 seconds, or a second less on a
	// slow machine.)
	body := string(l.w.body)
	if !strings.HasPrefix(body, `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"detail":"rate limit exceeded; retry after 3`) ||
		!strings.HasSuffix(body, ` seconds","violated-policies":["allocs_problem"]}`) {
		t.Errorf("body %s", body)
	}
}
