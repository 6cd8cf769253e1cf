package caddytest_test

import (
	"bufio"
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
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// Issue 34, the request side: a stream that did not ask for usage is asked
// for it (item 1), a stream whose usage never arrives is charged by the
// zone's unknown rule (item 2), a cost reads the request's JSON (item 4),
// with the official OpenAI client.

// llmUpstream stands in for the OpenAI API as it streams: POST
// /v1/chat/completions answers JSON, or with "stream": true chunks of
// "t<i>" ending with finish_reason "stop"; only when the request asks
// (stream_options.include_usage) does every chunk carry "usage": null and
// a last chunk with "choices": [] carry the usage, as the API does. POST
// /v1/responses streams the Responses API's events, its usage in
// response.completed. Every completion is tokens long.
type llmUpstream struct {
	*httptest.Server
	tokens int64
	chunks int
	// end is how a streamed completion ends: "" with the usage (when
	// asked) and [DONE]; "hold": the usage waits for the client to be gone
	// and is not sent; "stop": the stream ends after the last chunk;
	// "malformed": the usage's total is a string.
	end string

	mu       sync.Mutex
	requests []upstreamRequest
}

// upstreamRequest is what the upstream read of one request.
type upstreamRequest struct {
	body          string
	contentLength int64
	asked         bool
}

func newLLMUpstream(t *testing.T, tokens int64, chunks int) *llmUpstream {
	u := &llmUpstream{tokens: tokens, chunks: chunks}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *llmUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if r.Method != http.MethodPost || err != nil {
		http.Error(w, fmt.Sprint(err), http.StatusBadRequest)
		return
	}
	asked := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	u.mu.Lock()
	u.requests = append(u.requests, upstreamRequest{string(body), r.ContentLength, asked})
	u.mu.Unlock()
	f := w.(http.Flusher)
	switch {
	case r.URL.Path == "/v1/responses":
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, responsesStream(u.tokens))
	case r.URL.Path != "/v1/chat/completions":
		http.NotFound(w, r)
	case !req.Stream:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":%s}`, req.Model, chatUsage(u.tokens))
	default:
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range chatStream(req.Model, u.chunks, asked, u.tokens) {
			if strings.Contains(ev, `"choices":[]`) || ev == "data: [DONE]\n\n" {
				switch u.end {
				case "hold":
					<-r.Context().Done()
					return
				case "stop":
					return
				case "malformed":
					ev = strings.Replace(ev, `"total_tokens":`+strconv.FormatInt(u.tokens, 10), `"total_tokens":"lots"`, 1)
				}
			}
			io.WriteString(w, ev)
			f.Flush()
		}
	}
}

func chatUsage(total int64) string {
	return fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, total/10, total-total/10, total)
}

// chatStream is a streamed chat completion's events: chunks of content,
// the last with finish_reason "stop"; asked, every chunk with "usage":
// null and then the usage chunk; then [DONE].
func chatStream(model string, chunks int, asked bool, total int64) []string {
	null := ""
	if asked {
		null = `,"usage":null`
	}
	var evs []string
	for i := range chunks {
		choice := fmt.Sprintf(`{"index":0,"delta":{"content":"t%d"},"finish_reason":null}`, i)
		if i == chunks-1 {
			choice = `{"index":0,"delta":{},"finish_reason":"stop"}`
		}
		evs = append(evs, fmt.Sprintf("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[%s]%s}\n\n", model, choice, null))
	}
	if asked {
		evs = append(evs, fmt.Sprintf("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":%s}\n\n", model, chatUsage(total)))
	}
	return append(evs, "data: [DONE]\n\n")
}

// responsesStream is a streamed Responses API answer: its usage comes in
// response.completed, unasked.
func responsesStream(total int64) string {
	resp := func(status, usage string) string {
		return fmt.Sprintf(`{"id":"resp_1","object":"response","created_at":1,"status":%q,"model":"gpt-test","output":[],"usage":%s}`, status, usage)
	}
	usage := fmt.Sprintf(`{"input_tokens":%d,"input_tokens_details":{"cached_tokens":0},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}`, total/10, total-total/10, total)
	return "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":" + resp("in_progress", "null") + "}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"hello\",\"logprobs\":[]}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":" + resp("completed", usage) + "}\n\n"
}

// seen returns the requests the upstream read, and forgets them.
func (u *llmUpstream) seen() []upstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := u.requests
	u.requests = nil
	return out
}

// usageSite is a settle zone of tokens per API key in front of the
// upstream, with the settle block's options OPTS.
const usageSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.Authorization}
			events 1000
			window 1h
			cost 100
			settle json @PATH@ @OPTS@
		}
		settle_wait 0
		@STORE@
		response {
			body ` + "`" + openAIRefusal + "`" + `
		}
	}
	reverse_proxy @APP@ {
		flush_interval -1
	}
}`

func loadUsageSite(t *testing.T, up *llmUpstream, zone, path, opts, store string) {
	t.Helper()
	load(t, newTester(t), config("", usageSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "PATH", path, "OPTS", opts, "STORE", store))
}

// keyState reads a key of a zone in the admin API: its remaining and debt.
func keyState(t *testing.T, zone, key string) (remaining, debt float64) {
	t.Helper()
	path := "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape("Bearer "+key)
	code, body := adminAPI(t, "GET", path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, code, body)
	}
	remaining, _ = body["remaining"].(float64)
	debt, _ = body["debt"].(float64)
	return remaining, debt
}

// expectDebt checks a key's debt, to within the 10 tokens that refill in
// the 36 s a test may take (1,000 an hour).
func expectDebt(t *testing.T, zone, key string, want int64, what string) {
	t.Helper()
	if _, debt := keyState(t, zone, key); int64(debt) > want || int64(debt) < want-10 {
		t.Errorf("%s: the key's debt is %v, want %d", what, debt, want)
	}
}

// streamChat streams a chat completion with the official client, with
// include_usage when ask, and returns its content, the usage it read,
// whether a chunk had no choice (what a client indexing choices[0] trips
// on), and the error.
func streamChat(c openai.Client, ask bool) (content string, total int64, empty bool, err error) {
	params := openai.ChatCompletionNewParams{
		Model:    "gpt-test",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	}
	if ask {
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	}
	s := c.Chat.Completions.NewStreaming(context.Background(), params)
	defer s.Close()
	for s.Next() {
		ch := s.Current()
		if len(ch.Choices) == 0 {
			empty = true
		} else {
			content += ch.Choices[0].Delta.Content
		}
		if ch.Usage.TotalTokens > 0 {
			total = ch.Usage.TotalTokens
		}
	}
	return content, total, empty, s.Err()
}

// expectRefusal checks that err is the client's rate-limit error with a
// Retry-After in [lo, hi].
func expectRefusal(t *testing.T, err error, lo, hi int64, what string) {
	t.Helper()
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("%s: %v, want the client's 429", what, err)
	}
	if retry, _ := strconv.ParseInt(apiErr.Response.Header.Get("Retry-After"), 10, 64); retry < lo || retry > hi {
		t.Errorf("%s: Retry-After %d, want %d to %d", what, retry, lo, hi)
	}
}

// Item 1, the case: 30 streamed completions of 50,000 tokens each
// that do not ask for usage, on a budget of 1,000 an hour estimated at
// 100. Before, each paid its estimate: 10 admitted. Asked for the usage,
// the first settles 50,000 (a debt of 49,000) and the other 29 are
// refused, as the client's rate-limit error with a Retry-After of the
// debt (49,100 tokens at 1,000 an hour: 176,760 s). The client never saw
// the usage chunk it did not ask for; a client that asked sees it, a
// completion not streamed is forwarded as it came.
func TestSettleAskUsageMemory(t *testing.T) { checkAskUsage(t, "") }

// TestSettleAskUsageRedis is TestSettleAskUsageMemory on the Redis store.
func TestSettleAskUsageRedis(t *testing.T) {
	checkAskUsage(t, "store redis "+redistest.Start(t).URL())
}

func checkAskUsage(t *testing.T, store string) {
	up := newLLMUpstream(t, 50_000, 5)
	zone := zoneName("ask_usage")
	loadUsageSite(t, up, zone, "usage.total_tokens", "", store)
	key := "sk-ask-" + nonce
	c := openAIClient(siteA, key)
	admitted := 0
	for i := range 30 {
		content, total, empty, err := streamChat(c, false)
		if err != nil {
			if i > 0 {
				expectRefusal(t, err, 176_750, 176_760, fmt.Sprintf("completion %d", i))
			}
			continue
		}
		admitted++
		waitSettled(t, zone, key) // the settle follows the response's end
		if content != "t0t1t2t3" || empty || total != 0 {
			t.Errorf("completion %d: the client read %q, a chunk without choices %v, usage %d; want the stream it asked for (no usage)", i, content, empty, total)
		}
	}
	if admitted != 1 {
		t.Fatalf("%d streamed completions of 50,000 tokens admitted on a budget of 1,000, want 1", admitted)
	}
	if reqs := up.seen(); len(reqs) != 1 || !reqs[0].asked || reqs[0].contentLength != int64(len(reqs[0].body)) {
		t.Fatalf("the upstream read %+v; want one request asking for usage, its Content-Length its length", reqs)
	}
	expectDebt(t, zone, key, 49_000, "not asked")

	// A client that asks for usage reads it; the charge is the same.
	key = "sk-asked-" + nonce
	content, total, empty, err := streamChat(openAIClient(siteA, key), true)
	if err != nil || content != "t0t1t2t3" || !empty || total != 50_000 {
		t.Fatalf("asked: %q, usage chunk %v, usage %d, %v; want the usage it asked for", content, empty, total, err)
	}
	waitSettled(t, zone, key)
	expectDebt(t, zone, key, 49_000, "asked")

	// Not streamed: forwarded as it came, settled to its usage.
	key = "sk-json-" + nonce
	jc := openAIClient(siteA, key)
	res, err := jc.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "gpt-test", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	})
	if err != nil || res.Usage.TotalTokens != 50_000 {
		t.Fatalf("not streamed: %v %v", res, err)
	}
	if reqs := up.seen(); len(reqs) != 2 || strings.Contains(reqs[1].body, "stream_options") {
		t.Fatalf("the upstream read %+v; want the completion not streamed as the client sent it", reqs)
	}
	waitSettled(t, zone, key)
	expectDebt(t, zone, key, 49_000, "not streamed")
}

// postChat POSTs body to the site's chat completions as key, and returns
// the body the client read.
func postChat(t *testing.T, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, siteA+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := loopbackClient(4).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Item 1, the client's view byte for byte: a stream that did not ask for
// usage reads what the API sends such a stream, but for the "usage": null
// every chunk carries once usage is asked for (docs/protocols.md); one
// that asked reads what the API sends, usage chunk included. With
// ask_usage off the request goes as it came, and its stream too; its
// usage never arrives: the unknown rule charges it (here 2,000).
func TestSettleAskUsageBytes(t *testing.T) {
	up := newLLMUpstream(t, 300, 4)
	zone := zoneName("ask_bytes")
	loadUsageSite(t, up, zone, "usage.total_tokens", "", "")
	unasked := strings.Join(chatStream("m", 4, false, 300), "")
	asked := strings.Join(chatStream("m", 4, true, 300), "")

	code, got := postChat(t, "sk-b1-"+nonce, `{"model":"m","stream":true,"messages":[]}`)
	if code != 200 || strings.ReplaceAll(got, `,"usage":null}`, `}`) != unasked || strings.Count(got, `"usage":null`) != 4 {
		t.Fatalf("not asked: %d\n%s\nwant, but for \"usage\":null in each chunk:\n%s", code, got, unasked)
	}
	waitSettled(t, zone, "sk-b1-"+nonce)
	if _, debt := keyState(t, zone, "sk-b1-"+nonce); debt != 0 {
		t.Fatalf("not asked: debt %v", debt)
	}
	if r, _ := keyState(t, zone, "sk-b1-"+nonce); r < 700 || r > 701 {
		t.Fatalf("not asked: remaining %v, want 700 (300 settled)", r)
	}
	code, got = postChat(t, "sk-b2-"+nonce, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`)
	if code != 200 || got != asked {
		t.Fatalf("asked: %d\n%s\nwant\n%s", code, got, asked)
	}
	if reqs := up.seen(); len(reqs) != 2 || reqs[0].body != `{"model":"m","stream":true,"messages":[],"stream_options":{"include_usage":true}}` ||
		reqs[1].body != `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}` {
		t.Fatalf("the upstream read %+v", reqs)
	}

	zone = zoneName("ask_off")
	loadUsageSite(t, up, zone, "usage.total_tokens", "{\n\t\t\t\task_usage off\n\t\t\t\tunknown 2000\n\t\t\t}", "")
	code, got = postChat(t, "sk-b3-"+nonce, `{"model":"m","stream":true,"messages":[]}`)
	if code != 200 || got != unasked {
		t.Fatalf("ask_usage off: %d\n%s\nwant\n%s", code, got, unasked)
	}
	if reqs := up.seen(); len(reqs) != 1 || reqs[0].asked {
		t.Fatalf("ask_usage off: the upstream read %+v", reqs)
	}
	waitSettled(t, zone, "sk-b3-"+nonce)
	expectDebt(t, zone, "sk-b3-"+nonce, 1000, "ask_usage off, unknown 2000")
}

// leaveEarly streams body as key and hangs up once the chunk with
// finish_reason "stop" arrived, before the usage; chunked sends the body
// without a Content-Length.
func leaveEarly(t *testing.T, key, body string, chunked bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var in io.Reader = strings.NewReader(body)
	if chunked {
		in = io.MultiReader(in) // a length net/http cannot see
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, siteA+"/v1/chat/completions", in)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := loopbackClient(4).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before its last chunk: %v", err)
		}
		if strings.Contains(line, `"finish_reason":"stop"`) {
			return
		}
	}
}

// waitSettled waits until the key's first charge in flight settled: its
// remaining is no longer the estimate's 900.
func waitSettled(t *testing.T, zone, key string) {
	t.Helper()
	waitFor(t, zone, key, "the key's charge settled", func(r, d float64) bool { return r != 900 || d != 0 })
}

// waitFor waits until the key's remaining and debt are as ok says (a
// settle follows its response's end, which the client may see first).
func waitFor(t *testing.T, zone, key, what string, ok func(remaining, debt float64) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, d := keyState(t, zone, key)
		if ok(r, d) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: remaining %v, debt %v", what, r, d)
		}
	}
}

// Item 2, the case: a 20-chunk stream of a 50,000-token
// completion, the client hanging up after finish_reason "stop", before
// the usage. Before, it paid its estimate (100); read to its end, the same
// request leaves a debt of 49,000. Now the unknown rule charges it:
// by default the request's max_tokens (60,000) plus its body's length,
// more than staying; without an output bound, the body's length plus the
// bytes of the stream read; a fixed amount (unknown 2000); a request
// field plus an amount (unknown {...max_tokens} 500). A stream the upstream stops, and a malformed
// usage, are charged the same way.
func TestSettleLeaveEarlyMemory(t *testing.T) { checkLeaveEarly(t, "") }

// TestSettleLeaveEarlyRedis is TestSettleLeaveEarlyMemory on the Redis
// store.
func TestSettleLeaveEarlyRedis(t *testing.T) {
	checkLeaveEarly(t, "store redis "+redistest.Start(t).URL())
}

func checkLeaveEarly(t *testing.T, store string) {
	const bounded = `{"model":"m","stream":true,"max_tokens":60000,"messages":[{"role":"user","content":"hello"}]}`
	const unbounded = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`
	up := newLLMUpstream(t, 50_000, 20)
	// Without an output bound: the body's length plus the bytes of the 20
	// chunks the zone read (asked for usage, each carries "usage": null).
	streamed := int64(len(unbounded) + len(strings.Join(chatStream("m", 20, true, 0)[:20], "")))
	// A chunked body over the 64 KiB read (not rewritten, its max_tokens
	// unread): at least the bytes read of it, 64 KiB + 1, plus the chunks.
	huge := `{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"` + strings.Repeat("x", 70_000) + `"}]}`
	hugeCharge := int64(64<<10+1) + int64(len(strings.Join(chatStream("m", 20, false, 0)[:20], "")))
	for _, c := range []struct {
		name, opts, end, body string
		chunked               bool
		debt                  int64 // the charge less the capacity, 1,000
	}{
		{"default", "", "hold", bounded, false, 60_000 + int64(len(bounded)) - 1000},
		{"default unbounded", "", "hold", unbounded, false, streamed - 1000},
		{"chunked over the bound", "", "hold", huge, true, hugeCharge - 1000},
		{"fixed", "{\n\t\t\t\tunknown 2000\n\t\t\t}", "hold", bounded, false, 1000},
		{"field", "{\n\t\t\t\tunknown {http.rate_limit.request_json.max_tokens} 500\n\t\t\t}", "hold", bounded, false, 60_500 - 1000},
		{"upstream stopped", "", "stop", bounded, false, 60_000 + int64(len(bounded)) - 1000},
		{"malformed", "", "malformed", bounded, false, 60_000 + int64(len(bounded)) - 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			zone := zoneName("leave")
			loadUsageSite(t, up, zone, "usage.total_tokens", c.opts, store)
			up.end = c.end
			key := "sk-leave-" + nonce
			leaveEarly(t, key, c.body, c.chunked)
			waitSettled(t, zone, key)
			expectDebt(t, zone, key, c.debt, "left early")
			up.end = ""
			if c.name == "default" {
				// Staying to the end costs what the upstream reports.
				key = "sk-stay-" + nonce
				code, _ := postChat(t, key, c.body)
				if code != 200 {
					t.Fatalf("stayed: %d", code)
				}
				waitSettled(t, zone, key)
				expectDebt(t, zone, key, 49_000, "stayed")
			}
			up.seen()
		})
	}
}

// The Responses API reports its usage in response.completed unasked:
// a zone settling response.usage.total_tokens charges it exactly (300 a
// response, estimated 100: 4 admitted of 1,000, the fifth refused as the
// client's rate-limit error, Retry-After 1,080 s), and the request goes
// as it came.
func TestSettleResponsesAPI(t *testing.T) {
	up := newLLMUpstream(t, 300, 0)
	zone := zoneName("responses")
	loadUsageSite(t, up, zone, "response.usage.total_tokens", "", "")
	key := "sk-resp-" + nonce
	c := openAIClient(siteA, key)
	admitted := 0
	for i := range 10 {
		s := c.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
			Model: "gpt-test", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
		})
		var total int64
		text := ""
		for s.Next() {
			ev := s.Current()
			switch ev.Type {
			case "response.output_text.delta":
				text += ev.Delta
			case "response.completed":
				total = ev.Response.Usage.TotalTokens
			}
		}
		err := s.Err()
		s.Close()
		if err != nil {
			if i == admitted {
				expectRefusal(t, err, 1079, 1080, fmt.Sprintf("response %d", i))
			}
			continue
		}
		if text != "hello" || total != 300 {
			t.Fatalf("response %d: %q, usage %d", i, text, total)
		}
		admitted++
		left := max(1000-300*float64(admitted), 0)
		waitFor(t, zone, key, "the settle", func(r, d float64) bool { return r >= left && r <= left+1 && (admitted < 4 || d >= 190) })
	}
	if admitted != 4 {
		t.Fatalf("%d responses of 300 tokens admitted on a budget of 1,000, want 4", admitted)
	}
	for _, r := range up.seen() {
		if strings.Contains(r.body, "stream_options") {
			t.Fatalf("the Responses API request was rewritten: %s", r.body)
		}
	}
}

// Item 4: `cost {http.rate_limit.request_json.max_tokens} 1000` charges
// the request's max_tokens (before: always the default, 1,000); a request
// without it, the default.
func TestCostFromRequestJSON(t *testing.T) {
	up := newLLMUpstream(t, 300, 0)
	zone := zoneName("cost_json")
	site := strings.Replace(strings.Replace(usageSite, "cost 100", "cost {http.rate_limit.request_json.max_tokens} 1000", 1), "settle json @PATH@ @OPTS@", "", 1)
	load(t, newTester(t), config("", site, "ZONE", zone, "APP", up.Listener.Addr().String(), "STORE", ""))
	for _, c := range []struct {
		body      string
		remaining int64
	}{{`{"model":"m","max_tokens":300}`, 700}, {`{"model":"m","max_tokens":200}`, 500}, {`{"model":"m"}`, -1}} {
		req, _ := http.NewRequest(http.MethodPost, siteA+"/v1/chat/completions", bytes.NewReader([]byte(c.body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer sk-cost-"+nonce)
		resp, err := loopbackClient(4).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		rem := resp.Header.Get("X-Ratelimit-Remaining")
		if c.remaining < 0 {
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("%s: %d, want 429 (the default 1,000 over the 500 left)", c.body, resp.StatusCode)
			}
			continue
		}
		if resp.StatusCode != 200 || rem != strconv.FormatInt(c.remaining, 10) {
			t.Fatalf("%s: %d, remaining %s, want %d", c.body, resp.StatusCode, rem, c.remaining)
		}
	}
}
