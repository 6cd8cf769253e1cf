package admin

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// adminCall sends one request to the admin.api.rate_limit routes and
// returns the status and the JSON body, as Caddy's admin server would
// answer it (an error becomes its status and {"error": ...}).
func adminCall(t *testing.T, method, target string) (int, map[string]any) {
	t.Helper()
	routes := API{}.Routes()
	if len(routes) != 1 || !strings.HasPrefix(target, routes[0].Pattern) {
		t.Fatalf("%s is not under the module's route %v", target, routes)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest(method, target, nil)
	err := routes[0].Handler.ServeHTTP(w, r)
	var body map[string]any
	if err != nil {
		var ae caddy.APIError
		if !errors.As(err, &ae) {
			t.Fatalf("%s %s: a non-API error %v (Caddy would answer 500)", method, target, err)
		}
		return ae.HTTPStatus, map[string]any{"error": ae.Err.Error(), "allow": w.Header().Get("Allow")}
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, target, ct)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s %s: %v in %q", method, target, err, w.Body.String())
	}
	return w.Code, body
}

// The listing shows the configuration registered last; while it is being
// loaded, and if it fails (its handlers unregistered), the running one shows.
func TestRegistryGenerations(t *testing.T) {
	zone := func(name string) []Zone {
		return []Zone{{Name: name, Info: func() ZoneInfo { return ZoneInfo{Name: name} }}}
	}
	h1, h2 := new(int), new(int)     // the handlers
	app1, app2 := new(int), new(int) // their configurations
	has := func(name string) bool {
		code, _ := adminCall(t, "GET", "/rate_limit/zones/"+name)
		return code == 200
	}
	Register(app1, h1, true, zone("gen_old"))
	if !has("gen_old") || has("gen_new") {
		t.Fatal("only the old configuration is registered")
	}
	Register(app2, h2, true, zone("gen_new"))
	if has("gen_old") || !has("gen_new") {
		t.Fatal("the newer configuration must win")
	}
	Unregister(h2) // the new configuration failed to load
	if !has("gen_old") || has("gen_new") {
		t.Fatal("after the new configuration's cleanup, the old one must show again")
	}
	Unregister(h1)
	Unregister(h1) // idempotent
	if has("gen_old") {
		t.Fatal("an unregistered configuration still shows")
	}
	registry.Lock()
	_, kept1 := registry.gens[app1]
	_, kept2 := registry.gens[app2]
	registry.Unlock()
	if kept1 || kept2 {
		t.Fatal("the registry kept the generation of a configuration with no handler left")
	}
}
