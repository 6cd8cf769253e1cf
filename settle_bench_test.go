package sluice

import (
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// completion is a next handler answering an OpenAI-style completion: a JSON
// body, or (sse) a stream of 8 chunks and a last one with the usage.
func completion(sse bool) caddyhttp.Handler {
	const chunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hello"}}],"usage":null}` + "\n\n"
	const last = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":290,"total_tokens":300}}` + "\n\ndata: [DONE]\n\n"
	const body = `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":290,"total_tokens":300}}`
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if !sse {
			w.Header().Set("Content-Type", "application/json")
			_, err := w.Write([]byte(body))
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
}

// BenchmarkServeHTTPSettle serves a completion (JSON, or an event stream
// of 9 events) through a zone without settle and one with `settle json
// usage.total_tokens`, on the memory store and on Redis: what reading the
// body and settling it cost per request (the Redis settle is queued on a
// pipeline worker).
//
//	go test -run XXX -bench ServeHTTPSettle -benchmem .
func BenchmarkServeHTTPSettle(b *testing.B) {
	srv := redistest.Start(b)
	for _, store := range []struct{ name, block string }{{"memory", ""}, {"redis", "store redis " + srv.URL()}} {
		for _, body := range []string{"json", "sse"} {
			for _, settle := range []string{"", "settle json usage.total_tokens"} {
				name := store.name + "/" + body + "/plain"
				if settle != "" {
					name = store.name + "/" + body + "/settle"
				}
				b.Run(name, func(b *testing.B) {
					block := `rate_limit {
		zone bench_settle_` + store.name + body + map[bool]string{true: "_s", false: ""}[settle != ""] + ` {
			key {http.request.header.X-User}
			events 1000000000
			window 1s
			cost 100
			` + settle + `
		}
		` + store.block + `
	}`
					l := newLoop(b, block, completion(body == "sse"))
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						if err := l.serve(b); err != nil || l.w.status != http.StatusOK {
							b.Fatalf("status %d, err %v", l.w.status, err)
						}
					}
				})
			}
		}
	}
}
