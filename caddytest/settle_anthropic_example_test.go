package caddytest_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// hostRewrite sends every request to the site of host.
type hostRewrite struct {
	base http.RoundTripper
	host string
}

func (h hostRewrite) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	return h.base.RoundTrip(r)
}

// TestExampleLLMAnthropic loads examples/llm.Caddyfile in front of the
// stand-in Anthropic API and checks what its header promises of the
// Anthropic site, with the official client: input and output tokens are
// two budgets a minute per key, each settled to its own field (the input
// read from a stream's message_start, the output from a JSON answer); the
// refusal is the SDK's rate_limit_error, naming the zone, with a
// Retry-After saying when the debt is repaid.
func TestExampleLLMAnthropic(t *testing.T) {
	up := newAnthropicUpstream(t, 15000, 100)
	zones := map[string]string{}
	for _, z := range []string{"llm_rpm", "llm_tpm", "llm_model_tpm", "llm_anthropic_itpm", "llm_anthropic_otpm"} {
		zones[z] = zoneName(z)
	}
	loadExample(t, "llm.Caddyfile", map[string]string{"SLUICE_ANTHROPIC_UPSTREAM": up.Listener.Addr().String()}, zones)
	// run sends messages until the first refusal (at most 10) and returns
	// how many passed and the refusal.
	run := func(key string, stream bool) (int, *anthropic.Error) {
		hc := loopbackClient(4)
		hc.Transport = hostRewrite{base: retryEOF{base: hc.Transport}, host: "anthropic.localhost"}
		c := anthropic.NewClient(option.WithBaseURL(siteA+"/"), option.WithAPIKey(key), option.WithMaxRetries(0), option.WithHTTPClient(hc))
		for i := range 10 {
			if _, _, err := message(context.Background(), c, stream); err != nil {
				var apiErr *anthropic.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Type() != "rate_limit_error" {
					t.Fatalf("%s, message %d: %v, want a 429 rate_limit_error", key, i, err)
				}
				return i, apiErr
			}
		}
		return 10, nil
	}
	// Input: 15,000 a message against 40,000 estimated 1,000: 3 pass (the
	// third leaves a debt of 5,000), the fourth waits for 6,000: 9s.
	passed, refusal := run("sk-in-"+nonce, true)
	if passed != 3 || refusal == nil || !strings.Contains(refusal.Message, zones["llm_anthropic_itpm"]) {
		t.Fatalf("input tokens: %d passed, then %v; want 3, then a refusal by %s", passed, refusal, zones["llm_anthropic_itpm"])
	}
	if ra := refusal.Response.Header.Get("Retry-After"); ra != "9" {
		t.Errorf("input tokens: Retry-After %q, want 9 (a debt of 5,000 and an estimate of 1,000 at 40,000 a minute)", ra)
	}
	// Output: 3,000 a message against 8,000 estimated 500: 3 pass (9,000:
	// a debt of 1,000), the fourth waits for 1,500: 11.25s.
	up.input.Store(100)
	up.output.Store(3000)
	passed, refusal = run("sk-out-"+nonce, false)
	if passed != 3 || refusal == nil || !strings.Contains(refusal.Message, zones["llm_anthropic_otpm"]) {
		t.Fatalf("output tokens: %d passed, then %v; want 3, then a refusal by %s", passed, refusal, zones["llm_anthropic_otpm"])
	}
	if ra := refusal.Response.Header.Get("Retry-After"); ra != "12" {
		t.Errorf("output tokens: Retry-After %q, want 12 (a debt of 1,000 and an estimate of 500 at 8,000 a minute: 11.25s)", ra)
	}
	if n := up.calls.Load(); n != 6 {
		t.Errorf("the upstream served %d messages, want 6", n)
	}
}
