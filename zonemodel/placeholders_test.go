package zonemodel

import "testing"

// TestUnknownPlaceholder: Caddy's http.request.* placeholders and their
// families, and other namespaces, are known; misspelt request fields and
// names of no namespace are not.
func TestUnknownPlaceholder(t *testing.T) {
	for ph, unknown := range map[string]bool{
		"http.request.remote.host":                false,
		"http.request.remote.host/24,64":          false,
		"http.request.header.X-Api-Key":           false,
		"http.request.tls.client.fingerprint":     false,
		"http.request.host.labels.1":              false,
		"http.request.uri.query.key":              false,
		"http.request.orig_uri.path.file_escaped": false,
		"http.vars.client_ip":                     false,
		"http.auth.user.id":                       false,
		"http.request.remote_ip":                  true,
		"http.request.client_ip":                  true,
		"http.request.header.":                    true,
		"remote_ip":                               true,
	} {
		if got := unknownPlaceholder(ph); got != unknown {
			t.Errorf("unknownPlaceholder(%q) = %v, want %v", ph, got, unknown)
		}
	}
}
