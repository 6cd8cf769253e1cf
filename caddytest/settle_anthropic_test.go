package caddytest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// anthropicUpstream is a stand-in Anthropic Messages API: POST
// /v1/messages answers a Message, or with "stream": true the events of
// Anthropic's stream (event: and data: lines, a ping, message_start's usage
// with the input tokens and output_tokens 1, message_delta's cumulative
// output tokens, message_stop), usage always included.
type anthropicUpstream struct {
	*httptest.Server
	input, output atomic.Int64
	calls         atomic.Int64
}

func newAnthropicUpstream(t *testing.T, input, output int64) *anthropicUpstream {
	u := &anthropicUpstream{}
	u.input.Store(input)
	u.output.Store(output)
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

// anthropicMessage is the non-streamed answer.
func anthropicMessage(model string, input, output int64) string {
	return fmt.Sprintf(`{"id":"msg_01","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":%d,"service_tier":"standard"}}`, model, input, output)
}

// anthropicEvents is the streamed answer, event by event.
func anthropicEvents(model string, input, output int64) []string {
	return []string{
		fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%q,\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1,\"service_tier\":\"standard\"}}}\n\n", model, input),
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
		"event: ping\ndata: {\"type\": \"ping\"}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
		fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":%d}}\n\n", output),
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
	}
}

func (u *anthropicUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	u.calls.Add(1)
	w.Header().Set("Request-Id", "req_01")
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, anthropicMessage(req.Model, u.input.Load(), u.output.Load()))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	for _, ev := range anthropicEvents(req.Model, u.input.Load(), u.output.Load()) {
		io.WriteString(w, ev)
		w.(http.Flusher).Flush()
	}
}

// anthropicRefusal is a refusal in Anthropic's error shape, which the
// official clients read.
const anthropicRefusal = `{"type":"error","error":{"type":"rate_limit_error","message":"rate limit exceeded in {http.rate_limit.zone}: retry in {http.rate_limit.retry_after}s"}}`

// anthropicSite is three settle zones per API key (x-api-key, Anthropic's
// header, or Authorization, which the Go SDK sends) in front of the stand-in:
// the tokens in and out together (@ZONE@: 1,000 an hour, the estimate
// @COST@), and input and output tokens as budgets of their own (the
// provider's ITPM and OTPM), large enough never to refuse here.
const anthropicSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key} {http.request.header.Authorization}
			events 1000
			window 1h
			cost @COST@
			settle json usage.input_tokens|message.usage.input_tokens usage.output_tokens
		}
		zone @ZONE@_in {
			key {http.request.header.X-Api-Key} {http.request.header.Authorization}
			events 100000
			window 24h
			cost @COST@
			settle json usage.input_tokens|message.usage.input_tokens
		}
		zone @ZONE@_out {
			key {http.request.header.X-Api-Key} {http.request.header.Authorization}
			events 100000
			window 24h
			cost @COST@
			settle json usage.output_tokens
		}
		settle_wait 5s
		@STORE@
		response {
			body ` + "`" + anthropicRefusal + "`" + `
		}
	}
	reverse_proxy @APP@ {
		flush_interval -1
	}
}`

// countingTransport counts the requests a client sends.
type countingTransport struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.RoundTrip(r)
}

// anthropicClient is the official client against site with the API key
// given, retrying at most retries times (the 429 honoured with its
// Retry-After), and the transport counting its requests.
func anthropicClient(site, key string, retries int) (anthropic.Client, *countingTransport) {
	c := loopbackClient(16)
	ct := &countingTransport{base: retryEOF{base: c.Transport}}
	c.Transport = ct
	return anthropic.NewClient(option.WithBaseURL(site+"/"), option.WithAPIKey(key), option.WithMaxRetries(retries),
		option.WithHTTPClient(c)), ct
}

// message sends one message, streamed or not, and returns the input and
// output tokens the client read, or the API error.
func message(ctx context.Context, c anthropic.Client, stream bool) (in, out int64, err error) {
	params := anthropic.MessageNewParams{
		Model:     "claude-test",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))},
	}
	if !stream {
		m, err := c.Messages.New(ctx, params)
		if err != nil {
			return 0, 0, err
		}
		return m.Usage.InputTokens, m.Usage.OutputTokens, nil
	}
	s := c.Messages.NewStreaming(ctx, params)
	defer s.Close()
	var acc anthropic.Message
	for s.Next() {
		if err := acc.Accumulate(s.Current()); err != nil {
			return 0, 0, err
		}
	}
	if s.Err() != nil {
		return 0, 0, s.Err()
	}
	if acc.Content[0].Text != "Hello" {
		return 0, 0, fmt.Errorf("the client read the text %q, want Hello", acc.Content[0].Text)
	}
	return acc.Usage.InputTokens, acc.Usage.OutputTokens, nil
}

// keyView reads a key of a zone through the admin API.
func keyView(t *testing.T, zone, key string) map[string]any {
	t.Helper()
	path := "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape(key)
	code, body := adminAPI(t, "GET", path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, code, body)
	}
	return body
}

// checkAnthropicBudget: messages of 25 tokens in and 275 out (300) against
// 1,000 tokens an hour, estimated 100: 4 pass, the fifth is refused as the
// SDK's rate-limit error with Retry-After 1080 (a debt of 200, the 100 it
// asks for at 1,000 an hour), which the admin view of the key repeats; the
// input and output budgets were charged exactly 4 × 25 and 4 × 275; and an
// SDK allowed to retry waits for the Retry-After instead of retrying at
// once.
func checkAnthropicBudget(t *testing.T, up *anthropicUpstream, zone string, stream bool) {
	t.Helper()
	key := "sk-ant-" + nonce + strconv.FormatBool(stream)
	c, _ := anthropicClient(siteA, key, 0)
	adminKey := "Bearer " + key // this SDK sends its key as Authorization
	ctx := context.Background()
	passed := 0
	for i := range 6 {
		in, out, err := message(ctx, c, stream)
		if err == nil {
			if in != 25 || out != 275 {
				t.Fatalf("message %d: the client read %d in, %d out, want 25 and 275", i, in, out)
			}
			passed++
			continue
		}
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Type() != "rate_limit_error" {
			t.Fatalf("message %d: %v, want a 429 rate_limit_error", i, err)
		}
		if !strings.Contains(apiErr.Message, zone) {
			t.Errorf("message %d: the refusal's message %q does not name the zone", i, apiErr.Message)
		}
		if i == passed {
			retry, _ := strconv.ParseInt(apiErr.Response.Header.Get("Retry-After"), 10, 64)
			if retry < 1079 || retry > 1080 {
				t.Errorf("the first refusal's Retry-After is %d, want 1080", retry)
			}
			view := keyView(t, zone, adminKey)
			if ms, _ := view["retry_after_ms"].(float64); ms < 1078000 || ms > 1080000 || view["allowed"] != false {
				t.Errorf("the admin view's retry_after_ms is %v (allowed %v), want the refusal's 1080s", view["retry_after_ms"], view["allowed"])
			}
		}
	}
	if passed != 4 || up.calls.Load() != 4 {
		t.Fatalf("%d messages admitted, the upstream served %d; want 4 (1,000 tokens, 300 each, estimated 100)", passed, up.calls.Load())
	}
	for z, want := range map[string]float64{zone + "_in": 100000 - 4*25, zone + "_out": 100000 - 4*275} {
		// A token bucket of 100,000 a day refills about one token a second.
		if rem, _ := keyView(t, z, adminKey)["remaining"].(float64); rem < want || rem > want+30 {
			t.Errorf("%s: remaining %v, want %v", z, rem, want)
		}
	}
	// The SDK honours Retry-After: allowed two retries, it waits the
	// 1,080s rather than asking again, until its context ends.
	rc, count := anthropicClient(siteA, key, 2)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, _, err := message(cctx, rc, stream); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the retrying client: %v, want its context's deadline (waiting out Retry-After)", err)
	}
	if n := count.n.Load(); n != 1 {
		t.Errorf("the retrying client sent %d requests, want 1 (then waited for Retry-After)", n)
	}
}

func TestSettleAnthropicMemory(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			up := newAnthropicUpstream(t, 25, 275)
			zone := zoneName("anthropic")
			load(t, newTester(t), config("", anthropicSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "COST", "100", "STORE", ""))
			checkAnthropicBudget(t, up, zone, stream)
		})
	}
}

func TestSettleAnthropicRedis(t *testing.T) {
	srv := redistest.Start(t)
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			up := newAnthropicUpstream(t, 25, 275)
			zone := zoneName("anthropic_redis")
			load(t, newTester(t), config("", anthropicSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "COST", "100", "STORE", "store redis "+srv.URL()))
			checkAnthropicBudget(t, up, zone, stream)
		})
	}
}

// TestSettleAnthropicStreamUnchanged: the stream the client receives
// through Sluice is the upstream's, byte for byte (event: lines, the ping).
func TestSettleAnthropicStreamUnchanged(t *testing.T) {
	up := newAnthropicUpstream(t, 25, 275)
	zone := zoneName("anthropic_bytes")
	load(t, newTester(t), config("", anthropicSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "COST", "100", "STORE", ""))
	req, _ := http.NewRequest(http.MethodPost, siteA+"/v1/messages", strings.NewReader(`{"model":"claude-test","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hello"}]}`))
	req.Header.Set("X-Api-Key", "sk-bytes-"+nonce)
	req.Header.Set("Content-Type", "application/json")
	resp, err := loopbackClient(2).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Join(anthropicEvents("claude-test", 25, 275), ""); !bytes.Equal(got, []byte(want)) {
		t.Fatalf("the stream changed on its way:\n got %q\nwant %q", got, want)
	}
}
