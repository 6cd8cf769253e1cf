package identity

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// This file reads the request fields a key may name (headers, cookies,
// query arguments) from the request itself, under the rule that
// Deriver.DeriveRequest states: one value, or several byte-identical ones, is that value; several
// different values are ambiguous. Caddy's placeholders join repeated
// headers and query arguments with "," (and take the first cookie whose
// name matches), so a client that repeats a field would otherwise choose
// its bucket while the backend, reading the field its own way, sees the
// identity of someone else.
//
// The common case, a field sent once, allocates nothing.

// value returns the part's value for req: the one value of its request
// field, ambiguous when the field carries different values; a variable
// ({client_ip} is {http.vars.client_ip}) from the request's variables, as
// Caddy's placeholder reads it but without going through every provider
// of the replacer; any other placeholder (or any placeholder without a
// request, or a request without variables) through r.
func (p *part) value(r Resolver, req *http.Request) (v string, ambiguous bool) {
	if p.variable != "" && req != nil {
		if vars, ok := req.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
			return stringOf(vars[p.variable]), false
		}
	}
	if p.field == nil || req == nil {
		return valueString(r, p.ph), false
	}
	switch p.field.Source {
	case SourceHeader:
		return headerValue(req.Header, p.field.Name)
	case SourceCookie:
		return cookieValue(req.Header, p.field.Name)
	case SourceQuery:
		if req.URL == nil {
			return "", false
		}
		return queryValue(req.URL.RawQuery, p.field.Name)
	}
	return valueString(r, p.ph), false
}

// oneOf accumulates the values of one field: the first, and whether any
// other differs from it.
type oneOf struct {
	v     string
	found bool
}

// add records value x, and reports false when it differs from an earlier
// one.
func (o *oneOf) add(x string) bool {
	if !o.found {
		o.v, o.found = x, true
		return true
	}
	return x == o.v
}

// headerValue reads header name from h: every field whose name equals
// name ignoring ASCII case and the separators '-', '_' and '.' counts.
// net/http stores field names canonicalised (x-api-key and X-API-KEY are
// one entry, over HTTP/1.1 and HTTP/2; a name stored in any other spelling
// is matched here all the same), but X_Api_Key and X.Api.Key are entries
// of their own, and CGI and FastCGI backends (PHP's $_SERVER, Caddy's
// php_fastcgi) see all three as the one variable HTTP_X_API_KEY. Caddy's
// server drops every header whose name holds '_' or '.' before any handler
// runs, unless the servers options expected_underscore_headers or
// expected_dot_headers keep it (and then drop its hyphenated spelling), so
// in Caddy the other spellings reach a zone only through those options:
// where they do, they are the same header here.
func headerValue(h http.Header, name string) (string, bool) {
	var o oneOf
	for k, vals := range h {
		if len(k) != len(name) || !sameHeaderName(k, name) {
			continue
		}
		for _, x := range vals {
			if !o.add(x) {
				return "", true
			}
		}
	}
	return o.v, false
}

// sameHeaderName reports whether header names a and b, of equal length,
// are equal ignoring ASCII case and which of '-', '_' and '.' separates
// their words.
func sameHeaderName(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == y || lower(x) == lower(y) || isSep(x) && isSep(y) {
			continue
		}
		return false
	}
	return true
}

func isSep(c byte) bool { return c == '-' || c == '_' || c == '.' }

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}

// cookieValue reads cookie name from the Cookie header fields of h: every
// "name=value" pair whose name equals name ignoring ASCII case counts (as
// Caddy's placeholder matches it), and two pairs differ unless their values
// are the same once decoded (cookieDecode). Unlike net/http, no pair
// is skipped for bytes a cookie should not hold, and there is no bound on
// the number of pairs (net/http ignores every cookie past 3000): a backend
// that reads such a pair still finds it counted.
func cookieValue(h http.Header, name string) (string, bool) {
	var o oneOf
	for _, line := range h["Cookie"] {
		for line != "" {
			var pair string
			pair, line, _ = strings.Cut(line, ";")
			n, v, _ := strings.Cut(pair, "=")
			if !equalFoldASCII(trimOWS(n), name) {
				continue
			}
			if !o.add(cookieDecode(trimOWS(v))) {
				return "", true
			}
		}
	}
	return o.v, false
}

// cookieDecode is a cookie value as the most lenient backend reads it:
// one pair of surrounding double quotes removed (net/http), then "%XX"
// and "+" decoded (PHP's urldecode; Node decodes "%XX" too). Keying on the
// decoded value can only merge values that some backend reads as one
// identity (alice and %61lice), never split one: so an encoding variant
// of a cookie buys no fresh bucket. A value that holds an escape costs one
// allocation.
func cookieDecode(v string) string {
	if len(v) > 1 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	if escaped(v) {
		v = queryUnescape(v)
	}
	return v
}

// trimOWS removes leading and trailing spaces and tabs (and CR, LF, as
// net/textproto's TrimString does).
func trimOWS(s string) string {
	for len(s) > 0 && isOWS(s[0]) {
		s = s[1:]
	}
	for len(s) > 0 && isOWS(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

func isOWS(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// equalFoldASCII reports whether a and b are equal ignoring ASCII case.
func equalFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if a[i] != b[i] && lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

// queryValue reads query argument name from the raw query q: every
// argument whose name, unescaped, equals name ignoring ASCII case counts,
// and their values are compared unescaped ("+" is a space, "%XX" a byte;
// a malformed escape is kept as it is). Arguments are separated by '&' and
// by ';' too: net/http drops an argument that holds a ';', where other
// servers split there, so either reading is counted. The value is returned
// unescaped; a value that holds an escape costs one allocation.
func queryValue(q, name string) (string, bool) {
	var o oneOf
	for q != "" {
		i := 0
		for i < len(q) && q[i] != '&' && q[i] != ';' {
			i++
		}
		arg := q[:i]
		if i < len(q) {
			i++
		}
		q = q[i:]
		n, v, _ := strings.Cut(arg, "=")
		if !unescapedEqualFold(n, name) {
			continue
		}
		if escaped(v) {
			v = queryUnescape(v)
		}
		if !o.add(v) {
			return "", true
		}
	}
	return o.v, false
}

// escaped reports whether a query value holds '+' or '%'.
func escaped(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] == '+' || v[i] == '%' {
			return true
		}
	}
	return false
}

// unescapedEqualFold reports whether raw, query-unescaped, equals name
// ignoring ASCII case, without allocating.
func unescapedEqualFold(raw, name string) bool {
	j := 0
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '+':
			c = ' '
		case c == '%' && i+2 < len(raw) && isHex(raw[i+1]) && isHex(raw[i+2]):
			c = unhex(raw[i+1])<<4 | unhex(raw[i+2])
			i += 2
		}
		if j >= len(name) || lower(c) != lower(name[j]) {
			return false
		}
		j++
	}
	return j == len(name)
}

// queryUnescape unescapes a query value: "+" is a space, "%XX" the byte
// XX; a '%' not followed by two hex digits stays as it is.
func queryUnescape(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '+':
			c = ' '
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			c = unhex(s[i+1])<<4 | unhex(s[i+2])
			i += 2
		}
		b.WriteByte(c)
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
