package identity

import (
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestVariablesReadFromTheRequest derives keys of a request prepared by
// Caddy's own server code: a variable ({client_ip} is
// {http.vars.client_ip}) read from the request's variables gives the
// token Caddy's replacer renders, and the other placeholders (a header,
// a request placeholder) are read as before, whatever the variables hold.
func TestVariablesReadFromTheRequest(t *testing.T) {
	req := httptest.NewRequest("GET", "/p", nil)
	req.RemoteAddr = "192.0.2.7:40000"
	req.Header.Set("X-User", "alice")
	repl := caddy.NewReplacer()
	req = caddyhttp.PrepareRequest(req, repl, httptest.NewRecorder(), &caddyhttp.Server{})
	caddyhttp.SetVar(req.Context(), "plan", 42)
	caddyhttp.SetVar(req.Context(), "tenant", []byte("acme"))
	for _, c := range []struct {
		cand string
		kind Kind
	}{
		{"{http.vars.client_ip}", KindIPv4},
		{"{http.vars.plan}", KindHash},
		{"t-{http.vars.tenant}-{http.vars.client_ip}", KindHash},
		{"{http.vars.missing}", KindEmpty},
		{"{http.request.header.X-User}", KindHash},
		{"{http.request.uri.path}", KindHash},
	} {
		d := mustDeriver(t, 24, 64, c.cand)
		got, _, amb := d.DeriveRequest(repl, req, nil)
		want, _ := d.Derive(repl, nil) // every placeholder through Caddy's replacer
		if amb != nil || got != want || got.Kind() != c.kind {
			t.Errorf("%s: token %s (ambiguous %v), want %s of kind %c", c.cand, got, amb, want, c.kind)
		}
	}
	// Without variables in its context, a request's variables are read
	// through the resolver.
	d := mustDeriver(t, 32, 64, "{http.vars.client_ip}")
	bare := httptest.NewRequest("GET", "/", nil)
	got, _, _ := d.DeriveRequest(mapResolver{"http.vars.client_ip": "198.51.100.1"}, bare, nil)
	if got.Kind() != KindIPv4 || got.String() != "41-c6336401" {
		t.Errorf("no variables: token %s, want 41-c6336401 (198.51.100.1)", got)
	}
}
