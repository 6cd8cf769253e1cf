package sluice

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// chain serves a request through handlers in order, as a route does (each
// the next one's caller), the last handing over to okHandler.
func chain(t *testing.T, user string, hs ...*Handler) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("GET", "/account/x", nil)
	r.Header.Set("X-User", user)
	caddyhttp.NewTestReplacer(r)
	w := httptest.NewRecorder()
	var next caddyhttp.Handler = okHandler
	for i := len(hs) - 1; i >= 0; i-- {
		h, n := hs[i], next
		next = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return h.ServeHTTP(w, r, n) })
	}
	if err := next.ServeHTTP(w, r); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	return w
}

// twoDirectives returns a per-IP-like directive (10 per hour) and a
// per-account-like one (1000 per hour), on one clock.
func twoDirectives(t *testing.T, headers string) (tight, roomy *Handler) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	tight = newHandler(t, `rate_limit {
		zone merge_tight_`+headers+` {
			key {http.request.header.X-User}
			events 10
			window 1h
		}
		headers `+headers+`
	}`, clock)
	roomy = newHandler(t, `rate_limit {
		zone merge_roomy_`+headers+` {
			key {http.request.header.X-User}
			events 1000
			window 1h
		}
		headers `+headers+`
	}`, clock)
	tight.logger, roomy.logger = zap.NewNop(), zap.NewNop()
	return tight, roomy
}

// TestTwoDirectivesLegacyHeaders: two rate_limit directives deciding one
// request report the most constrained zone of both in X-RateLimit-*,
// whichever runs first: the tight zone while both allow, the refusing one
// when one refuses.
func TestTwoDirectivesLegacyHeaders(t *testing.T) {
	for _, tightFirst := range []bool{true, false} {
		t.Run("tight first "+strconv.FormatBool(tightFirst), func(t *testing.T) {
			tight, roomy := twoDirectives(t, "legacy")
			order := []*Handler{tight, roomy}
			if !tightFirst {
				order = []*Handler{roomy, tight}
			}
			for i := int64(1); i <= 12; i++ {
				w := chain(t, "carol", order...)
				remaining := max(10-i, 0)
				if i > 10 {
					if w.Code != 429 {
						t.Fatalf("request %d: %d, want 429", i, w.Code)
					}
				} else if w.Code != 200 {
					t.Fatalf("request %d: %d, want 200", i, w.Code)
				}
				h := w.Header()
				if got := []string{h.Get("X-Ratelimit-Limit"), h.Get("X-Ratelimit-Remaining")}; !slices.Equal(got, []string{"10", strconv.FormatInt(remaining, 10)}) {
					t.Fatalf("request %d: X-RateLimit-Limit, -Remaining = %q, want the tight zone's [10 %d]", i, got, remaining)
				}
				for _, name := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
					if len(h[name]) != 1 {
						t.Fatalf("request %d: %s = %q, want one value", i, name, h[name])
					}
				}
			}
		})
	}
}

// TestTwoDirectivesDraftHeaders: with headers draft, the fields of two
// directives list every zone of both, once, in one field value each.
func TestTwoDirectivesDraftHeaders(t *testing.T) {
	for _, tightFirst := range []bool{true, false} {
		t.Run("tight first "+strconv.FormatBool(tightFirst), func(t *testing.T) {
			tight, roomy := twoDirectives(t, "draft")
			order := []*Handler{tight, roomy}
			if !tightFirst {
				order = []*Handler{roomy, tight}
			}
			for i := 1; i <= 11; i++ {
				w := chain(t, "dave", order...)
				want := 200
				if i == 11 {
					want = 429
				}
				if w.Code != want {
					t.Fatalf("request %d: %d, want %d", i, w.Code, want)
				}
				for _, f := range []string{"RateLimit-Policy", "RateLimit"} {
					if len(w.Header().Values(f)) != 1 {
						t.Errorf("request %d: %s %q, want one field value", i, f, w.Header().Values(f))
					}
				}
				got := parseDraft(t, w.Header())
				roomyLeft := int64(1000 - i)
				if i == 11 && tightFirst {
					roomyLeft++ // the tight zone refused before the roomy one decided
				}
				if len(got) != 2 && !(i == 11 && tightFirst) {
					t.Fatalf("request %d: %v, want both zones", i, got)
				}
				if g := got["merge_tight_draft"]; g.q != 10 || g.r != int64(max(10-i, 0)) {
					t.Errorf("request %d: tight zone %+v", i, g)
				}
				if g, ok := got["merge_roomy_draft"]; ok && (g.q != 1000 || g.r != roomyLeft) {
					t.Errorf("request %d: roomy zone %+v, want r=%d", i, g, roomyLeft)
				}
			}
		})
	}
}

// TestTwoRefusalsKeepTheLongerWait: a rate_limit in the error routes that
// refuses a request another one already refused keeps the headers of the
// refusal with the longer Retry-After (the placeholders are the latest
// refusal's, as TestSecondRefusalInErrorRoute checks).
func TestTwoRefusalsKeepTheLongerWait(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	long := newHandler(t, `rate_limit {
		zone merge_err_long {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
		response handle_errors
	}`, clock)
	short := newHandler(t, `rate_limit {
		zone merge_err_short {
			key {http.request.header.X-User}
			events 5
			window 1m
		}
	}`, clock)
	long.logger, short.logger = zap.NewNop(), zap.NewNop()
	user := map[string]string{"X-User": "mallory"} // refusalRequest's
	serve(t, long, "GET", "/", user)
	for range 5 {
		serve(t, short, "GET", "/", user)
	}

	r, _ := refusalRequest("GET")
	w := httptest.NewRecorder()
	err := long.ServeHTTP(w, r, okHandler)
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) || he.StatusCode != 429 {
		t.Fatalf("first: %v", err)
	}
	r = (&caddyhttp.HTTPErrorConfig{}).WithError(r, err)
	if err := short.ServeHTTP(w, r, okHandler); err != nil || w.Code != 429 {
		t.Fatalf("second: %d %v", w.Code, err)
	}
	h := w.Header()
	if got := []string{h.Get("Retry-After"), h.Get("X-Ratelimit-Limit"), h.Get("X-Ratelimit-Remaining")}; !slices.Equal(got, []string{"3600", "1", "0"}) {
		t.Errorf("Retry-After, X-RateLimit-Limit, -Remaining = %q, want the hour zone's [3600 1 0]", got)
	}
}
