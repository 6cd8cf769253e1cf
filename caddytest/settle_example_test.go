package caddytest_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// testExampleLLM loads examples/llm.Caddyfile (with load, given by
// TestExampleLLM) in front of the stand-in OpenAI-compatible upstream and
// checks what its header promises, with the official client: a key's
// tokens a minute, charged by the usage each response reports (debt
// included, Retry-After saying when it is repaid); its requests a minute;
// the model's tokens a minute across keys, read from the request's body,
// all or nothing with the keys' zones.
func testExampleLLM(t *testing.T, load func(t *testing.T, env, renames map[string]string)) {
	up := newOpenAIUpstream(t, 3000)
	zones := map[string]string{}
	for _, z := range []string{"llm_rpm", "llm_tpm", "llm_model_tpm"} {
		zones[z] = zoneName(z)
	}
	load(t, map[string]string{"SLUICE_LLM_UPSTREAM": up.Listener.Addr().String()}, zones)
	ctx := context.Background()
	// run sends completions of model until the first refusal (at most n)
	// and returns how many passed and the refusal. The model's zone reads
	// the model from the request body.
	run := func(key, model string, n int, stream bool, opts func(i int) []option.RequestOption) (int, *openai.Error) {
		c := openAIClient(siteA, key)
		for i := range n {
			if _, err := complete(ctx, c, model+nonce, stream, opts(i)...); err != nil {
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("%s, completion %d: %v, want a 429", key, i, err)
				}
				return i, apiErr
			}
		}
		return n, nil
	}

	// Tokens per key: 3,000 a completion against 40,000 with an estimate
	// of 1,000: 14 pass (the 14th starts with 39,000 spent and leaves a
	// debt of 2,000), the 15th waits for 3,000 tokens: 4.5s.
	none := func(int) []option.RequestOption { return nil }
	passed, refusal := run("sk-tpm-"+nonce, "a", 20, true, none)
	if passed != 14 || refusal == nil || !strings.Contains(refusal.Message, zones["llm_tpm"]) {
		t.Fatalf("tokens per key: %d passed, then %v; want 14, then a refusal by %s", passed, refusal, zones["llm_tpm"])
	}
	if ra := refusal.Response.Header.Get("Retry-After"); ra != "5" {
		t.Errorf("tokens per key: Retry-After %q, want 5 (a debt of 2,000 and an estimate of 1,000 at 40,000 a minute: 4.5s)", ra)
	}

	// Requests per key: small completions, 60 pass, the 61st is refused.
	up.tokens.Store(10)
	passed, refusal = run("sk-rpm-"+nonce, "b", 70, false, none)
	if passed != 60 || refusal == nil || !strings.Contains(refusal.Message, zones["llm_rpm"]) {
		t.Fatalf("requests per key: %d passed, then %v; want 60, then a refusal by %s", passed, refusal, zones["llm_rpm"])
	}

	// Tokens per model, across keys: 30,000 a completion, a key of its own
	// each: 14 pass (390,000 + 1,000 fit), the 15th is refused by the
	// model's zone, and nothing of its key's was spent.
	up.tokens.Store(30000)
	var lastKey string
	passed, refusal = run("sk-model-"+nonce, "c", 20, false, func(i int) []option.RequestOption {
		lastKey = "Bearer sk-model-" + nonce + "-" + strconv.Itoa(i)
		return []option.RequestOption{option.WithHeader("Authorization", lastKey)}
	})
	if passed != 14 || refusal == nil || !strings.Contains(refusal.Message, zones["llm_model_tpm"]) {
		t.Fatalf("tokens per model: %d passed, then %v (%s); want 14, then a refusal by %s", passed, refusal, refusal.Message, zones["llm_model_tpm"])
	}
	r := get(t, loopbackClient(1), siteA+"/v1/models", "Authorization: "+lastKey, "X-Model: d"+nonce)
	if got := r.header.Get("X-Ratelimit-Remaining"); got != "59" {
		// The tightest zone shows: the key's requests (59 left) when its
		// tokens were untouched by the refusal.
		t.Errorf("the refused key's next request shows X-RateLimit-Remaining %q, want 59 (nothing spent by the refusal)", got)
	}
	for m, want := range map[string]int{"a": 14, "b": 60, "c": 14} {
		if n := up.called(m + nonce); n != want {
			t.Errorf("the upstream served %d completions of model %s, want %d", n, m, want)
		}
	}
}
