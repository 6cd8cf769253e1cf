package sluice

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// BenchmarkServeHTTPAskUsage serves a streamed chat completion (a POST
// of a 200-byte JSON body, 8 chunks, the usage chunk, [DONE]) through a
// settle zone on the memory store: asked (the client set include_usage:
// nothing rewritten, nothing kept back), rewritten (the body read and
// rewritten, the usage chunk kept from the client) and ask_usage off
// (the body read for the unknown rule's output bound only).
//
//	go test -run XXX -bench ServeHTTPAskUsage -benchmem .
func BenchmarkServeHTTPAskUsage(b *testing.B) {
	const chunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hello"}}],"usage":null}` + "\n\n"
	const last = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":290,"total_tokens":300}}` + "\n\ndata: [DONE]\n\n"
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return err
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for range 8 {
			if _, err := w.Write([]byte(chunk)); err != nil {
				return err
			}
		}
		_, err := w.Write([]byte(last))
		return err
	})
	msgs := `"messages":[{"role":"user","content":"` + strings.Repeat("x", 120) + `"}]`
	for _, c := range []struct{ name, opts, body string }{
		{"asked", "", `{"model":"m","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`},
		{"rewritten", "", `{"model":"m","stream":true,` + msgs + `}`},
		{"ask_usage_off", "{\n\t\t\t\task_usage off\n\t\t\t}", `{"model":"m","stream":true,` + msgs + `}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := newHandler(b, `rate_limit {
		zone bench_ask_`+c.name+` {
			key {http.request.header.X-User}
			events 1000000000
			window 1s
			cost 100
			settle json usage.total_tokens `+c.opts+`
		}
	}`, nil)
			h.logger = zap.NewNop()
			body := []byte(c.body)
			r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			r.Header.Set("X-User", "bench")
			r.Header.Set("Content-Type", "application/json")
			repl := caddyhttp.NewTestReplacer(r)
			l := &loop{h: h, r: r, w: newBenchWriter(), repl: repl, orig: *repl, next: next}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
				if err := l.serve(b); err != nil || l.w.status != http.StatusOK {
					b.Fatalf("status %d, err %v", l.w.status, err)
				}
			}
		})
	}
}
