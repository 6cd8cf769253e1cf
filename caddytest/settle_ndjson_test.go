package caddytest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// ollamaLines is Ollama's native /api/chat stream (application/x-ndjson):
// a JSON object a line, the last with done: true and the counts.
func ollamaLines(prompt, eval int64) []string {
	return []string{
		`{"model":"llama3.2","created_at":"2026-12-07T16:00:00.000000Z","message":{"role":"assistant","content":"Hel"},"done":false}` + "\n",
		`{"model":"llama3.2","created_at":"2026-12-07T16:00:00.100000Z","message":{"role":"assistant","content":"lo"},"done":false}` + "\n",
		fmt.Sprintf(`{"model":"llama3.2","created_at":"2026-12-07T16:00:00.200000Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"total_duration":4883583458,"load_duration":1334875,"prompt_eval_count":%d,"prompt_eval_duration":342546000,"eval_count":%d,"eval_duration":4535599000}`, prompt, eval) + "\n",
	}
}

// ollamaUpstream answers /api/chat as Ollama does: streamed by default,
// one JSON object with "stream": false.
func ollamaUpstream(t *testing.T, prompt, eval int64) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream *bool `json:"stream"`
		}
		if r.URL.Path != "/api/chat" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		lines := ollamaLines(prompt, eval)
		if req.Stream != nil && !*req.Stream {
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			io.WriteString(w, strings.TrimSuffix(strings.Replace(lines[2], `"content":""`, `"content":"Hello"`, 1), "\n"))
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, l := range lines {
			io.WriteString(w, l)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// ollamaSite is a settle zone summing Ollama's prompt_eval_count (which
// Ollama leaves out when the whole prompt came from its cache: 0) and
// eval_count (events 1000, the estimate 100).
const ollamaSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Key}
			events 1000
			window 1h
			cost 100
			settle json prompt_eval_count? eval_count
		}
		@STORE@
	}
	reverse_proxy @APP@ {
		flush_interval -1
	}
}`

// checkOllama: a streamed and a single answer of 26 + 274 tokens each
// settle to 300, the stream reaching the client byte for byte.
func checkOllama(t *testing.T, store string) {
	up := ollamaUpstream(t, 26, 274)
	zone := zoneName("ollama")
	load(t, newTester(t), config("", ollamaSite, "ZONE", zone, "APP", up.Listener.Addr().String(), "STORE", store))
	c := loopbackClient(2)
	for _, stream := range []bool{true, false} {
		key := "ollama-" + strconv.FormatBool(stream) + nonce
		body := `{"model":"llama3.2","messages":[{"role":"user","content":"hello"}]}`
		if !stream {
			body = `{"model":"llama3.2","stream":false,"messages":[{"role":"user","content":"hello"}]}`
		}
		req, _ := http.NewRequest(http.MethodPost, siteA+"/api/chat", strings.NewReader(body))
		req.Header.Set("X-Key", key)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("stream=%v: %d %v", stream, resp.StatusCode, err)
		}
		if want := strings.Join(ollamaLines(26, 274), ""); stream && !bytes.Equal(got, []byte(want)) {
			t.Fatalf("the stream changed on its way:\n got %q\nwant %q", got, want)
		}
		settledTo(t, zone, key, 300, "stream="+strconv.FormatBool(stream))
	}
}

// TestSettleOllamaMemory: Ollama's NDJSON stream and single answer, memory
// store.
func TestSettleOllamaMemory(t *testing.T) { checkOllama(t, "") }

// TestSettleOllamaRedis: the same on the Redis store.
func TestSettleOllamaRedis(t *testing.T) {
	srv := redistest.Start(t)
	checkOllama(t, "store redis "+srv.URL())
}
