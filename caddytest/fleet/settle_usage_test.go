package fleet_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// Issue 34's request side across a fleet: 3 Caddy processes on one Redis,
// a zone of 1,000 tokens an hour (estimate 100) settled by the usage of
// OpenAI-shaped streams of 50,000 tokens whose clients do not ask for it.
//   - Asked for the usage: of 9 completions of one key, one on each
//     process in turn, exactly 1 is admitted (before: 9, each paying its
//     estimate), its debt of 49,000 seen by every process.
//   - A client that hangs up before the usage (max_tokens 60,000) is
//     charged the unknown rule's default, 60,000 plus its body's length:
//     its next 6 completions on the other processes are refused.
func TestSettleFleetAskUsage(t *testing.T) {
	const tokens = 50_000
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := range 4 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"},\"finish_reason\":null}]}\n\n", i)
			f.Flush()
		}
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
		f.Flush()
		if r.Header.Get("X-Leave") != "" {
			<-r.Context().Done() // the usage never reaches a client that left
			return
		}
		if req.StreamOptions.IncludeUsage {
			fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":%d}}\n\n", tokens)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	r := redistest.Start(t)
	routes := fmt.Sprintf(`rate_limit {
	zone ask_fleet {
		key {http.request.header.X-User}
		events 1000
		window 1h
		cost 100
		settle json usage.total_tokens
	}
	settle_wait 0
	store redis %s {
		timeout 250ms
	}
}
reverse_proxy %s {
	flush_interval -1
}`, r.URL(), up.Listener.Addr().String())
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("ask-%d", i), "", routes)
	}
	client := newClient(8)
	defer client.CloseIdleConnections()
	const body = `{"model":"m","stream":true,"max_tokens":60000,"messages":[{"role":"user","content":"hello"}]}`
	post := func(p *caddyProc, user string) result {
		req, _ := http.NewRequest(http.MethodPost, p.url("/v1/chat/completions"), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", user)
		return sendReq(client, req)
	}
	// debt reads the key's debt from process p's admin API.
	debt := func(p *caddyProc, user string) float64 {
		resp, err := client.Get(p.adminURL("/rate_limit/zones/ask_fleet/keys/" + url.PathEscape(user)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct{ Remaining, Debt float64 }
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v.Debt
	}
	waitDebt := func(p *caddyProc, user string, want float64) {
		for deadline := time.Now().Add(10 * time.Second); debt(p, user) < want-10; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the debt is %v, want %v", user, debt(p, user), want)
			}
		}
	}

	user := "ask-" + nonce
	admitted := 0
	for i := range 9 {
		res := post(procs[i%3], user)
		switch {
		case res.code == http.StatusOK && strings.Contains(res.body, `"choices":[]`):
			t.Fatalf("completion %d: the client read the usage chunk it did not ask for: %s", i, res.body)
		case res.code == http.StatusOK:
			admitted++
			waitDebt(procs[(i+1)%3], user, tokens-1000) // the settle follows the response's end
		case res.code != http.StatusTooManyRequests:
			t.Fatalf("completion %d: %v", i, res)
		}
	}
	if admitted != 1 {
		t.Fatalf("%d completions of %d tokens admitted across 3 processes on a budget of 1,000, want 1", admitted, tokens)
	}
	for _, p := range procs {
		if d := debt(p, user); d < tokens-1000-10 || d > tokens-1000 {
			t.Errorf("process %s shows a debt of %v, want %d", p.name, d, tokens-1000)
		}
	}

	user = "leave-" + nonce
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, procs[0].url("/v1/chat/completions"), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", user)
	req.Header.Set("X-Leave", "1")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	for rd := bufio.NewReader(resp.Body); ; {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before its last chunk: %v", err)
		}
		if strings.Contains(line, `"finish_reason":"stop"`) {
			break
		}
	}
	cancel()
	resp.Body.Close()
	charge := 60_000 + len(body)
	waitDebt(procs[1], user, float64(charge-1000))
	for i := range 6 {
		res := post(procs[1+i%2], user)
		if res.code != http.StatusTooManyRequests {
			t.Fatalf("after leaving early, completion %d: %v, want 429", i, res)
		}
		// The debt plus the 100 asked for, at 1,000 an hour.
		want := ((charge-1000+100)*36 + 9) / 10 // seconds, rounded up
		if ra, _ := strconv.Atoi(res.header.Get("Retry-After")); ra < want-40 || ra > want {
			t.Errorf("after leaving early: Retry-After %d, want %d", ra, want)
		}
	}
}
