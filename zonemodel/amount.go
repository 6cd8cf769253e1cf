package zonemodel

import (
	"fmt"
	"strings"

	"github.com/sluicehq/caddy-sluice/identity"
)

// RequestJSONPrefix begins the placeholders of the request's JSON body
// fields ({http.rate_limit.request_json.max_tokens}).
const RequestJSONPrefix = "http.rate_limit.request_json."

// neverNumbers are placeholders whose value is never a whole number: a
// per-request amount (a cost, a settle's unknown charge) from one of them
// would always fall back to its default.
var neverNumbers = map[string]bool{
	"http.request.host": true, "http.request.hostport": true, "http.request.method": true,
	"http.request.uri": true, "http.request.uri.path": true, "http.request.orig_uri": true,
	"http.request.orig_uri.path": true, "http.request.scheme": true, "http.request.proto": true,
	"http.request.remote": true, "http.request.remote.host": true, "http.request.local": true,
	"http.request.local.host": true, "http.vars.client_ip": true, "http.request.uuid": true,
}

// checkAmount refuses a per-request amount c (field names it) that can
// never be a whole number: text other than digits around the placeholders,
// a placeholder in neverNumbers, one of this plugin's own (set after the
// decision, so empty when the amount is read) but a request's JSON field,
// or a request JSON field without a dot path.
func checkAmount(field string, c identity.Candidate) error {
	raw := c.String()
	for rest := raw; rest != ""; {
		open := strings.IndexByte(rest, '{')
		lit := rest
		if open >= 0 {
			lit = rest[:open]
		}
		if strings.Trim(lit, "0123456789") != "" {
			return fmt.Errorf("%s %q can never be a whole number: the text %q around its placeholder is not digits", field, raw, lit)
		}
		if open < 0 {
			break
		}
		end := strings.IndexByte(rest[open:], '}')
		rest = rest[open+end+1:]
	}
	for _, ph := range c.Placeholders() {
		if path, ok := strings.CutPrefix(ph, RequestJSONPrefix); ok {
			if path == "" || strings.Contains(path, "..") || strings.HasPrefix(path, ".") || strings.HasSuffix(path, ".") {
				return fmt.Errorf("%s: {%s}: write a dot path of keys ({%smax_tokens})", field, ph, RequestJSONPrefix)
			}
			continue
		}
		if neverNumbers[ph] || strings.HasPrefix(ph, "http.rate_limit.") {
			return fmt.Errorf("%s %q can never be a whole number: {%s} is not a number (a request header, a query parameter, a variable or {%s<path>} can be)", field, raw, ph, RequestJSONPrefix)
		}
	}
	return nil
}
