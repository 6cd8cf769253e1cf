// Package identity turns a zone's key candidates into a bounded, private
// token: the first candidate whose placeholders are all non-empty wins; an
// IP address is canonicalised (brackets, port and zone stripped,
// IPv4-mapped IPv6 unmapped) and masked to the zone's prefix length; any
// other value is hashed (SHA-256, truncated to 128 bits), so no store and no
// log line ever holds a raw credential, and values of any length or bytes map
// to distinct fixed-size tokens.
//
// A placeholder that reads one field of the request (a header, a cookie, a
// query argument) is read from the request itself, not through Caddy's
// placeholder, which joins repeated fields with ",": the field must be
// unambiguous (see Deriver.DeriveRequest), so that no repetition of a field can
// buy a bucket other than the one its value names. A variable
// ({http.vars.<name>}, as {client_ip}) is read from the request's
// variables, where Caddy's placeholder reads it, without its replacer.
//
// Candidates are compiled once (at Provision); deriving a token per request
// allocates nothing for the common single-placeholder candidates.
package identity

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Size is the length of a Token.
const Size = algorithms.KeySize

// Token is a derived identity: the store's algorithms.Key, whose layout
// (candidate, kind, payload), text form (String, AppendText) and Scope are
// defined there.
type Token = algorithms.Key

// Kind says how a Token was made.
type Kind = algorithms.KeyKind

// Token kinds (see algorithms.KeyKind).
const (
	KindEmpty  = algorithms.KeyEmpty
	KindIPv4   = algorithms.KeyIPv4
	KindIPv6   = algorithms.KeyIPv6
	KindHash   = algorithms.KeyHash
	KindScoped = algorithms.KeyScoped
)

// MaxScope bounds the scope Token.Scope accepts, in bytes.
const MaxScope = algorithms.MaxScope

// Resolver reads a placeholder's value; *caddy.Replacer satisfies it.
type Resolver interface {
	Get(variable string) (any, bool)
}

// Candidate is one compiled key candidate.
type Candidate struct {
	raw   string
	parts []part
}

type part struct {
	lit string // literal text, when ph is empty
	ph  string // placeholder name, without braces
	// field is the request field the placeholder reads (a header, a
	// cookie, a query argument), read from the request itself when there
	// is one; nil for any other placeholder, read through the Resolver.
	field *Ambiguity
	// variable is the name of the variable ({http.vars.<name>}) the
	// placeholder reads, "" for none.
	variable string
}

// Field sources, the values of Ambiguity.Source.
const (
	SourceHeader = "header"
	SourceCookie = "cookie"
	SourceQuery  = "query"
)

// Ambiguity names a request field a key candidate reads, which a request
// carried several times with different values.
type Ambiguity struct {
	Source string // SourceHeader, SourceCookie or SourceQuery
	Name   string // the field's name, as the placeholder spells it
}

// Placeholder prefixes of the request fields read from the request itself
// (the Caddyfile's {header.X}, {cookie.X} and {query.X} expand to them).
const (
	headerPrefix = "http.request.header."
	cookiePrefix = "http.request.cookie."
	queryPrefix  = "http.request.uri.query."
	varsPrefix   = "http.vars."
)

// fieldOf returns the request field placeholder ph reads, or nil.
func fieldOf(ph string) *Ambiguity {
	for _, f := range [...]struct{ prefix, source string }{
		{headerPrefix, SourceHeader}, {cookiePrefix, SourceCookie}, {queryPrefix, SourceQuery},
	} {
		if name, ok := strings.CutPrefix(ph, f.prefix); ok && name != "" {
			return &Ambiguity{Source: f.source, Name: name}
		}
	}
	return nil
}

// variableOf returns the name of the variable placeholder ph reads, or "".
func variableOf(ph string) string {
	name, _ := strings.CutPrefix(ph, varsPrefix)
	if name == ph {
		return ""
	}
	return name
}

// Compile parses a candidate such as "{http.vars.client_ip}" or
// "tenant-{http.request.header.X-Tenant}".
func Compile(s string) (Candidate, error) {
	if s == "" {
		return Candidate{}, errors.New("empty key candidate")
	}
	c := Candidate{raw: s}
	for rest := s; rest != ""; {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			c.parts = append(c.parts, part{lit: rest})
			break
		}
		if open > 0 {
			c.parts = append(c.parts, part{lit: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return Candidate{}, fmt.Errorf("key candidate %q: unclosed placeholder", s)
		}
		name := rest[open+1 : open+end]
		if name == "" || strings.ContainsAny(name, "{ ") {
			return Candidate{}, fmt.Errorf("key candidate %q: malformed placeholder", s)
		}
		c.parts = append(c.parts, part{ph: name, field: fieldOf(name), variable: variableOf(name)})
		rest = rest[open+end+1:]
	}
	return c, nil
}

// String returns the candidate as configured.
func (c Candidate) String() string { return c.raw }

// Placeholders lists the placeholder names the candidate uses.
func (c Candidate) Placeholders() []string {
	var out []string
	for _, p := range c.parts {
		if p.ph != "" {
			out = append(out, p.ph)
		}
	}
	return out
}

// NeverEmpty reports whether the candidate always has a value: a literal, or
// the connection's client address.
func (c Candidate) NeverEmpty() bool {
	for _, p := range c.parts {
		switch p.ph {
		case "", "http.vars.client_ip", "http.request.remote.host", "http.request.remote":
		default:
			return false
		}
	}
	return true
}

// MaxCandidates bounds the key candidates of one zone.
const MaxCandidates = 16

// Deriver derives tokens for one zone.
type Deriver struct {
	cands  []Candidate
	v4bits int
	v6bits int
}

// NewDeriver compiles the zone's key derivation. v4bits and v6bits are the
// prefix lengths IPv4 and IPv6 addresses are masked to.
func NewDeriver(cands []Candidate, v4bits, v6bits int) (*Deriver, error) {
	if len(cands) == 0 {
		return nil, errors.New("no key candidate")
	}
	if len(cands) > MaxCandidates {
		return nil, fmt.Errorf("%d key candidates; at most %d", len(cands), MaxCandidates)
	}
	if v4bits < 1 || v4bits > 32 {
		return nil, fmt.Errorf("IPv4 prefix length %d out of range 1-32", v4bits)
	}
	if v6bits < 1 || v6bits > 128 {
		return nil, fmt.Errorf("IPv6 prefix length %d out of range 1-128", v6bits)
	}
	return &Deriver{cands: cands, v4bits: v4bits, v6bits: v6bits}, nil
}

// Same reports whether d and o derive the same token from every request:
// the same candidates in the same order, and the same prefix lengths.
func (d *Deriver) Same(o *Deriver) bool {
	if d == o {
		return true
	}
	if d == nil || o == nil || d.v4bits != o.v4bits || d.v6bits != o.v6bits || len(d.cands) != len(o.cands) {
		return false
	}
	for i := range d.cands {
		if d.cands[i].raw != o.cands[i].raw {
			return false
		}
	}
	return true
}

// Derive returns the token of the first non-empty candidate, or the empty
// token when every candidate is empty, every placeholder read through r (a
// request field as Caddy's placeholder renders it: repeated values joined).
// It serves callers without a request (tests, tools); a server deciding a
// request calls DeriveRequest. scratch is a buffer the caller may reuse
// between calls; Derive returns it, possibly grown.
func (d *Deriver) Derive(r Resolver, scratch []byte) (Token, []byte) {
	tok, scratch, _ := d.DeriveRequest(r, nil, scratch)
	return tok, scratch
}

// DeriveRequest returns the token of the first non-empty candidate, or the
// empty token when every candidate is empty. scratch is a buffer the caller
// may reuse between calls; DeriveRequest returns it, possibly grown.
//
// The request fields a candidate reads (a header, a cookie, a query
// argument) are read from req and must be unambiguous: a field carried
// several times with different values makes the candidate ambiguous, and
// DeriveRequest returns which field did (the token is then meaningless).
// Names match as backends may match them (docs/identity.md, "Repeated
// headers, cookies and query arguments"). The first candidate that is ambiguous or present decides.
// With a nil req, every placeholder is read through r.
func (d *Deriver) DeriveRequest(r Resolver, req *http.Request, scratch []byte) (Token, []byte, *Ambiguity) {
	for i := range d.cands {
		c := &d.cands[i]
		if len(c.parts) == 1 && c.parts[0].ph != "" {
			p := &c.parts[0]
			v, ambiguous := p.value(r, req)
			if ambiguous {
				return Token{}, scratch, p.field
			}
			if v == "" {
				continue
			}
			if tok, ok := d.addrToken(i, v); ok {
				return tok, scratch, nil
			}
			scratch = append(scratch[:0], v...)
			return hashToken(i, scratch), scratch, nil
		}
		buf, ok, amb := c.appendValue(r, req, scratch[:0], d)
		scratch = buf
		if amb != nil {
			return Token{}, scratch, amb
		}
		if !ok {
			continue
		}
		return hashToken(i, buf), scratch, nil
	}
	var t Token
	t[1] = byte(KindEmpty)
	return t, scratch, nil
}

// Raw returns the raw value of the first non-empty candidate (for log_key),
// read as DeriveRequest reads it; "" when every candidate is empty, or when the
// first that is not is ambiguous. It allocates; call it only when the
// value is logged.
func (d *Deriver) Raw(r Resolver, req *http.Request) string {
	for i := range d.cands {
		buf, ok, amb := d.cands[i].appendValue(r, req, nil, nil)
		if amb != nil {
			return ""
		}
		if ok {
			return string(buf)
		}
	}
	return ""
}

// AppendValue appends the candidate's plain value to b, every placeholder
// read through r; ok is false when any of its placeholders is empty or
// unknown.
func (c *Candidate) AppendValue(r Resolver, b []byte) ([]byte, bool) {
	b, ok, _ := c.appendValue(r, nil, b, nil)
	return b, ok
}

// appendValue appends the candidate's value to b; ok is false when any of its
// placeholders is empty or unknown (a candidate is only as present as all of
// its parts), and amb names the first ambiguous request field when none is
// empty. With a Deriver (the hashing path), each placeholder's value is
// framed by its length, so that "{a}{b}" with ("ab", "c") and ("a", "bc")
// hash differently, and a value that is an IP address is replaced by its
// canonical masked form, so that "{host}-{client_ip}" still gives one
// bucket per /64 and not one per address.
func (c *Candidate) appendValue(r Resolver, req *http.Request, b []byte, d *Deriver) (_ []byte, ok bool, amb *Ambiguity) {
	for i := range c.parts {
		p := &c.parts[i]
		if p.ph == "" {
			b = append(b, p.lit...)
			continue
		}
		v, ambiguous := p.value(r, req)
		if ambiguous {
			if amb == nil {
				amb = p.field
			}
			continue
		}
		if v == "" {
			return b, false, nil
		}
		if d == nil {
			b = append(b, v...)
			continue
		}
		if addr, ok := ParseAddr(v); ok {
			var txt [64]byte
			m := d.mask(addr).AppendTo(txt[:0])
			b = binary.AppendUvarint(b, uint64(len(m)))
			b = append(b, m...)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	if amb != nil {
		return b, false, amb
	}
	return b, true, nil
}

// mask returns addr masked to the zone's prefix length for its family.
func (d *Deriver) mask(addr netip.Addr) netip.Addr {
	bits := d.v6bits
	if addr.Is4() {
		bits = d.v4bits
	}
	p, _ := addr.Prefix(bits)
	return p.Addr()
}

// addrToken recognises an IP address, with or without brackets, port or zone,
// and returns its masked token.
func (d *Deriver) addrToken(i int, v string) (Token, bool) {
	addr, ok := ParseAddr(v)
	if !ok {
		return Token{}, false
	}
	var t Token
	t[0] = byte(i + 1)
	masked := d.mask(addr)
	if masked.Is4() {
		a := masked.As4()
		t[1] = byte(KindIPv4)
		copy(t[2:], a[:])
		return t, true
	}
	a := masked.As16()
	t[1] = byte(KindIPv6)
	copy(t[2:], a[:])
	return t, true
}

// ParseAddr parses an IP address in any of the forms a client address takes
// ("192.0.2.1", "192.0.2.1:443", "[2001:db8::1]:443", "fe80::1%eth0",
// "::ffff:192.0.2.1") and returns it canonical: zone dropped, IPv4-mapped
// IPv6 unmapped.
func ParseAddr(v string) (netip.Addr, bool) {
	if a, ok := parseIPv4(v); ok {
		return netip.AddrFrom4(a), true // the common client address, parsed at once
	}
	if len(v) > 0 && v[0] == '[' {
		end := strings.IndexByte(v, ']')
		if end < 0 || !validPort(v[end+1:], true) {
			return netip.Addr{}, false
		}
		v = v[1:end]
	} else if i := strings.IndexByte(v, ':'); i >= 0 && strings.LastIndexByte(v, ':') == i {
		// host:port with an IPv4 (or a name, which fails below)
		if !validPort(v[i:], false) {
			return netip.Addr{}, false
		}
		v = v[:i]
	}
	if i := strings.IndexByte(v, '%'); i >= 0 {
		if strings.IndexByte(v[:i], ':') < 0 {
			return netip.Addr{}, false // only IPv6 addresses have zones
		}
		v = v[:i]
	}
	// netip.ParseAddr allocates its error: rule out the values that cannot
	// be an address (API keys, account ids) before asking it.
	sep := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '.' || c == ':':
			sep = true
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
		default:
			return netip.Addr{}, false
		}
	}
	if !sep {
		return netip.Addr{}, false
	}
	addr, err := netip.ParseAddr(v)
	if err != nil {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// validPort reports whether s is empty (when allowed) or ":" followed by a
// decimal port number.
func validPort(s string, emptyOK bool) bool {
	if s == "" {
		return emptyOK
	}
	if s[0] != ':' || len(s) < 2 || len(s) > 6 {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func hashToken(i int, v []byte) Token {
	sum := sha256.Sum256(v)
	var t Token
	t[0] = byte(i + 1)
	t[1] = byte(KindHash)
	copy(t[2:], sum[:Size-2])
	return t
}

// parseIPv4 parses a plain dotted-quad IPv4 address as netip.ParseAddr
// does: four decimal fields of 0 to 255, none with a leading zero. ok is
// false for anything else, which ParseAddr then reads the long way.
func parseIPv4(v string) (a [4]byte, ok bool) {
	if len(v) < len("0.0.0.0") || len(v) > len("255.255.255.255") {
		return a, false
	}
	field, n, digits := 0, 0, 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c >= '0' && c <= '9':
			if digits > 0 && n == 0 {
				return a, false // a leading zero
			}
			n = n*10 + int(c-'0')
			if digits++; n > 255 {
				return a, false
			}
		case c == '.' && digits > 0 && field < 3:
			a[field] = byte(n)
			field, n, digits = field+1, 0, 0
		default:
			return a, false
		}
	}
	if field != 3 || digits == 0 {
		return a, false
	}
	a[3] = byte(n)
	return a, true
}

// valueString returns a placeholder's value as a string, "" when unknown.
func valueString(r Resolver, name string) string {
	v, ok := r.Get(name)
	if !ok {
		return ""
	}
	return stringOf(v)
}

// stringOf renders a placeholder's value as Caddy's replacer renders it
// into text; nil is "".
func stringOf(v any) string {
	if v == nil {
		return ""
	}
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case fmt.Stringer:
		return v.String()
	case []string:
		return strings.Join(v, ",")
	}
	return fmt.Sprint(v)
}
