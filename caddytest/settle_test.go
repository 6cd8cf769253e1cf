package caddytest_test

import (
	"compress/gzip"
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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// openAIUpstream is a stand-in OpenAI-compatible API: POST
// /v1/chat/completions answers a JSON completion, or with "stream": true
// a text/event-stream of chunks whose last carries the usage (when the
// request asks for it), then [DONE]. Every completion reports tokens
// total_tokens; each event is sent gap apart, the first after delay. Like
// the API it stands in for, it compresses (gzip) what it sends when the
// request accepts it, and with alwaysGzip whatever the request says.
type openAIUpstream struct {
	*httptest.Server
	tokens     atomic.Int64
	delay      time.Duration
	gap        time.Duration
	events     int
	alwaysGzip bool
	// calls counts the completions seen, per model.
	mu    sync.Mutex
	calls map[string]int
}

func newOpenAIUpstream(t *testing.T, tokens int64) *openAIUpstream {
	u := &openAIUpstream{events: 3, calls: map[string]int{}}
	u.tokens.Store(tokens)
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *openAIUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.calls[req.Model]++
	u.mu.Unlock()
	total := u.tokens.Load()
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, total/3, total-total/3, total)
	time.Sleep(u.delay)
	flusher := w.(http.Flusher)
	var out io.Writer = w
	flush := flusher.Flush
	if u.alwaysGzip || strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		defer zw.Close()
		out = zw
		flush = func() {
			zw.Flush()
			flusher.Flush()
		}
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(out, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":%s}`, req.Model, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range u.events {
		if i > 0 {
			time.Sleep(u.gap)
		}
		fmt.Fprintf(out, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}],\"usage\":null}\n\n", req.Model, i)
		flush()
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(out, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":%s}\n\n", req.Model, usage)
	}
	io.WriteString(out, "data: [DONE]\n\n")
	flush()
}

func (u *openAIUpstream) called(model string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[model]
}

// openAIRefusal is a refusal in the OpenAI API's error shape, which the
// official clients read.
const openAIRefusal = `{"error":{"message":"rate limit exceeded in {http.rate_limit.zone}: retry in {http.rate_limit.retry_after}s","type":"rate_limit_exceeded","param":null,"code":"rate_limit_exceeded"}}`

// tokenSite is one settle zone of tokens per API key, in front of the
// stand-in upstream.
const tokenSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.Authorization}
			events @EVENTS@
			window 1h
			cost @COST@
			settle json usage.total_tokens
		}
		settle_wait 5s
		@STORE@
		response {
			body ` + "`" + openAIRefusal + "`" + `
		}
	}
	reverse_proxy @APP@ {
		flush_interval -1
	}
}`

// openAIClient is the official client against site, with the API key
// given and no retries of its own (a 429 is the test's to see); a request
// whose connection the old server of a reload took and closed unanswered is
// sent again (retryEOF).
func openAIClient(site, key string) openai.Client {
	c := loopbackClient(64)
	c.Transport = retryEOF{base: c.Transport}
	return openai.NewClient(option.WithBaseURL(site+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0),
		option.WithHTTPClient(c))
}

// complete makes one completion, streamed or not, and returns the total
// tokens the response reported, or the API error.
func complete(ctx context.Context, c openai.Client, model string, stream bool, headers ...option.RequestOption) (int64, error) {
	params := openai.ChatCompletionNewParams{
		Model:    model,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	}
	if !stream {
		res, err := c.Chat.Completions.New(ctx, params, headers...)
		if err != nil {
			return 0, err
		}
		return res.Usage.TotalTokens, nil
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(ctx, params, headers...)
	defer s.Close()
	var total int64
	for s.Next() {
		if u := s.Current().Usage; u.TotalTokens > 0 {
			total = u.TotalTokens
		}
	}
	return total, s.Err()
}

// The test: a budget of 1,000 tokens an hour, an estimate of 100
// and actual usage of 300 admit 4 completions, not 10; the fifth is refused
// with a Retry-After that matches the debt (1,200 spent: the 100 it asks
// for fit once 300 tokens have refilled, 1,080s). JSON and streamed, with
// the official client; memory store (Redis: TestSettleOpenAIRedis).
func TestSettleOpenAIMemory(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			up := newOpenAIUpstream(t, 300)
			zone := zoneName("tokens")
			load(t, newTester(t), config("", tokenSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "EVENTS", "1000", "COST", "100", "STORE", ""))
			checkTokenBudget(t, up, zone, stream)
		})
	}
}

// checkTokenBudget runs the sequence against the loaded tokenSite.
func checkTokenBudget(t *testing.T, up *openAIUpstream, zone string, stream bool) {
	t.Helper()
	key := "sk-" + nonce + strconv.FormatBool(stream)
	c := openAIClient(siteA, key)
	ctx := context.Background()
	passed := 0
	for i := range 10 {
		var resp *http.Response
		total, err := complete(ctx, c, "gpt-test", stream, option.WithResponseInto(&resp))
		if err == nil {
			if total != 300 {
				t.Fatalf("completion %d: the client read %d tokens, want 300", i, total)
			}
			passed++
			continue
		}
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("completion %d: %v, want a 429", i, err)
		}
		if i == passed {
			retry, _ := strconv.ParseInt(apiErr.Response.Header.Get("Retry-After"), 10, 64)
			if retry < 1079 || retry > 1080 {
				t.Errorf("the first refusal's Retry-After is %d, want 1080 (a debt of 200 tokens and a cost of 100, at 1,000 an hour)", retry)
			}
		}
	}
	if passed != 4 {
		t.Fatalf("%d completions admitted, want 4 (1,000 tokens, 300 each, estimated 100)", passed)
	}
	if n := up.called("gpt-test"); n != 4 {
		t.Fatalf("the upstream served %d completions, want 4", n)
	}
	// The admin API shows the debt: 1,200 spent of 1,000, less what has
	// refilled since (a token every 3.6s).
	path := "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape("Bearer "+key)
	code, body := adminAPI(t, "GET", path)
	if debt, _ := body["debt"].(float64); code != http.StatusOK || debt < 199 || debt > 200 {
		t.Errorf("GET %s: %d, debt %v, want 200: %v", path, code, body["debt"], body)
	}
}

// Estimates in flight: 20 concurrent completions of one key whose
// estimates (100 each, 2,000) exceed the budget (1,000) but whose settled
// amounts (40 each, 800) fit: the requests beyond the budget wait for the
// charges in flight to settle, and all pass.
func TestSettleEstimatesInFlightMemory(t *testing.T) {
	up := newOpenAIUpstream(t, 40)
	up.delay = 100 * time.Millisecond
	zone := zoneName("tokens_inflight")
	load(t, newTester(t), config("", tokenSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "EVENTS", "1000", "COST", "100", "STORE", ""))
	checkEstimatesInFlight(t, up)
}

// TestSettleBehindEncode is TestSettleOpenAIMemory in a site that also
// compresses (`encode gzip`, which runs after rate_limit): the client asks
// for gzip, and the amounts are still read (the request goes on with
// Accept-Encoding: identity, so neither the upstream nor encode compress).
func TestSettleBehindEncode(t *testing.T) {
	site := strings.Replace(tokenSite, "\trate_limit {", "\tencode gzip\n\trate_limit {", 1)
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			up := newOpenAIUpstream(t, 300)
			zone := zoneName("tokens_encode")
			load(t, newTester(t), config("", site, "ZONE", zone, "APP", up.Listener.Addr().String(), "EVENTS", "1000", "COST", "100", "STORE", ""))
			checkTokenBudget(t, up, zone, stream)
		})
	}
}

// TestSettleOpenAIRedis is TestSettleOpenAIMemory on the Redis store: the
// settle is the script's (lua/settle.lua), queued on the pipeline.
func TestSettleOpenAIRedis(t *testing.T) {
	srv := redistest.Start(t)
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			up := newOpenAIUpstream(t, 300)
			zone := zoneName("tokens_redis")
			load(t, newTester(t), config("", tokenSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "EVENTS", "1000", "COST", "100", "STORE", "store redis "+srv.URL()))
			checkTokenBudget(t, up, zone, stream)
		})
	}
}

// TestSettleEstimatesInFlightRedis is TestSettleEstimatesInFlightMemory on
// the Redis store.
func TestSettleEstimatesInFlightRedis(t *testing.T) {
	srv := redistest.Start(t)
	up := newOpenAIUpstream(t, 40)
	up.delay = 100 * time.Millisecond
	zone := zoneName("tokens_inflight_redis")
	load(t, newTester(t), config("", tokenSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "EVENTS", "1000", "COST", "100", "STORE", "store redis "+srv.URL()))
	checkEstimatesInFlight(t, up)
}

func checkEstimatesInFlight(t *testing.T, up *openAIUpstream) {
	t.Helper()
	c := openAIClient(siteA, "sk-inflight-"+nonce)
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = complete(context.Background(), c, "gpt-test", i%2 == 0)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("completion %d: %v", i, err)
		}
	}
	if n := up.called("gpt-test"); n != 20 {
		t.Fatalf("the upstream served %d completions, want 20", n)
	}
}
