package admin

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// adapt adapts a Caddyfile to JSON (the adapter httpcaddyfile registers).
func adapt(t *testing.T, caddyfile string) ([]byte, error) {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	return out, err
}

// TestUIDirectiveParseErrors: rate_limit_ui takes a matcher and nothing
// else; an argument or a block is an error naming the directive.
func TestUIDirectiveParseErrors(t *testing.T) {
	for _, c := range []struct{ name, body, want, line string }{
		{"argument", "rate_limit_ui /sluice/* extra", `rate_limit_ui takes no arguments`, "Caddyfile:2"},
		{"block", "rate_limit_ui /sluice/* {\n\t\tpath /x\n\t}", `rate_limit_ui takes no options`, "Caddyfile:3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := adapt(t, ":8080 {\n\t"+c.body+"\n}\n")
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.line) {
				t.Errorf("error %v, want one at %s saying %q", err, c.line, c.want)
			}
		})
	}
}

// TestUIResource: the path under the directive names its resource, read
// from its end, wherever the directive is placed.
func TestUIResource(t *testing.T) {
	for p, want := range map[string]string{
		"/":                              "ui",
		"/sluice/":                       "ui",
		"/sluice/ui":                     "ui",
		"/sluice/ui.js":                  "ui.js",
		"/sluice/activity":               "activity",
		"/sluice/zones":                  "zones",
		"/sluice/zones/":                 "zones/",
		"/sluice/zones/activity":         "zones/activity",
		"/a/b/zones/login%2Fx":           "zones/login%2Fx",
		"/zones/z/tokens/h1-00":          "zones/z/tokens/h1-00",
		"/sluice/zones/z/keys/10.0.0.1":  "zones/z/keys/10.0.0.1",
		"/sluice/zones/z/keys/a%2Fb":     "zones/z/keys/a%2Fb",
		"/sluice/zones/zones/tokens/e0-": "zones/zones/tokens/e0-",
	} {
		if got, ok := uiResource(p); !ok || got != want {
			t.Errorf("%s: %q %v, want %q", p, got, ok, want)
		}
	}
	for _, p := range []string{"/sluice", "/sluice/other", "/sluice/zones/z/peek/x"} {
		if got, ok := uiResource(p); ok {
			t.Errorf("%s: %q, want no resource", p, got)
		}
	}
}
