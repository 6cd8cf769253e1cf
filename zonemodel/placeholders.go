package zonemodel

import "strings"

// requestPlaceholders are the http.request.* placeholders Caddy's HTTP
// server defines (caddyhttp/replacer.go), whole names and prefixes of
// families; a key on any other http.request.* name reads nothing.
var (
	requestPlaceholders = []string{"method", "scheme", "proto", "proto_name", "host", "port", "hostport",
		"local", "local.host", "local.port", "remote", "remote.host", "remote.port",
		"uri", "uri_escaped", "uri.path", "uri.path_escaped", "uri.path.file", "uri.path.dir",
		"uri.path.file.base", "uri.path.file.ext", "uri.query", "uri.query_escaped", "uri.prefixed_query",
		"duration", "duration_ms", "uuid", "body", "body_base64",
		"orig_method", "orig_uri", "orig_uri.path", "orig_uri.path.file", "orig_uri.path.file_escaped",
		"orig_uri.path.dir", "orig_uri.query", "orig_uri.prefixed_query"}
	requestPlaceholderFamilies = []string{"header.", "cookie.", "host.labels.", "tls.", "uri.path.",
		"uri.query.", "orig_uri.path.", "remote.host/"}
)

// unknownPlaceholder reports whether ph names no placeholder: an
// http.request.* name Caddy does not define (such as
// {http.request.remote_ip}), or a name of no namespace ({remote_ip}, a
// Caddyfile shorthand that does not exist). Other namespaces are left
// alone: any module may add placeholders there.
func unknownPlaceholder(ph string) bool {
	if !strings.Contains(ph, ".") {
		return true
	}
	name, ok := strings.CutPrefix(ph, "http.request.")
	if !ok {
		return false
	}
	for _, f := range requestPlaceholderFamilies {
		if strings.HasPrefix(name, f) && len(name) > len(f) {
			return false
		}
	}
	for _, p := range requestPlaceholders {
		if name == p {
			return false
		}
	}
	return true
}

// peerAddress reports whether ph reads the connection's peer address,
// which Caddy leaves empty on HTTP/3 early data (docs/identity.md).
func peerAddress(ph string) bool {
	return ph == "http.request.remote.host" || ph == "http.request.remote"
}
