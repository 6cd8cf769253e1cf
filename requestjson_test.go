package sluice

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestRequestJSONKey: a zone keyed on a field of the request's JSON body
// ({http.rate_limit.request_json.model}) gives each model its bucket; the
// next handler gets the body whole, however long; a body that is not JSON,
// or whose field lies beyond the first 64 KiB, falls to the next
// candidate; a directive whose keys read no body field reads no body.
func TestRequestJSONKey(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone rj_model {
			key {http.rate_limit.request_json.model} unknown
			events 10
			window 1m
		}
	}`, nil)
	pad := strings.Repeat("x", requestJSONMax)
	for i, c := range []struct {
		body, contentType string
		remaining         string
	}{
		{`{"model":"a","messages":[]}`, "application/json", "9"},
		{`{"messages":[{"role":"user","content":"model"}],"model":"a"}`, "application/json; charset=utf-8", "8"},
		{`{"model":"b"}`, "application/json", "9"},
		{`{"model":7}`, "application/json", "9"}, // the number's digits
		{`{"model":"a"}`, "text/plain", "9"},     // not JSON: unknown
		{`{"pad":"` + pad + `","model":"a"}`, "application/json", "8"},
		{`{"model":"a","pad":"` + pad + `"}`, "application/json", "7"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(c.body))
		r.Header.Set("Content-Type", c.contentType)
		caddyhttp.NewTestReplacer(r)
		w := httptest.NewRecorder()
		var got string
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			b, err := io.ReadAll(r.Body)
			got = string(b)
			return err
		})
		if err := h.ServeHTTP(w, r, next); err != nil || w.Code != http.StatusOK {
			t.Fatalf("request %d: %d %v", i, w.Code, err)
		}
		if got != c.body {
			t.Errorf("request %d: the next handler read %d bytes of a body of %d", i, len(got), len(c.body))
		}
		if rem := w.Header().Get("X-RateLimit-Remaining"); rem != c.remaining {
			t.Errorf("request %d (%.40s, %s): remaining %s, want %s", i, c.body, c.contentType, rem, c.remaining)
		}
	}

	plain := newHandler(t, `rate_limit {
		zone rj_plain {
			key {http.request.header.X-Model} unknown
			events 10
			window 1m
		}
	}`, nil)
	if n := len(plain.on[atPrepare]); n != 0 {
		t.Fatalf("a directive reading no body field joined the prepare stage (%d hooks)", n)
	}
}
