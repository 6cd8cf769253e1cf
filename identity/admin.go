package identity

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// This file serves the admin API, which addresses a client by the raw value
// an operator knows (an IP address, an API key) or by the token a log line
// shows, and must find the very token Derive gives that client.

// Candidates returns the deriver's key candidates, in order.
func (d *Deriver) Candidates() []Candidate {
	return append([]Candidate(nil), d.cands...)
}

// Prefixes returns the prefix lengths IPv4 and IPv6 addresses are masked to.
func (d *Deriver) Prefixes() (v4bits, v6bits int) { return d.v4bits, d.v6bits }

// TokenFor returns the token Derive gives a request whose first non-empty
// candidate is candidate i (0-based) and whose value is raw, the value as
// the candidate renders it (what Raw returns, what log_key logs; for a
// request field, its one value, as DeriveRequest reads it): for a
// candidate made of one placeholder, an IP address in any of its forms is
// masked to the zone's prefix, any other value hashed; a candidate with
// literal text around one placeholder must see that text around the value;
// a candidate made of literal text only matches that text. ok is false
// when candidate i cannot render raw, and for candidates of several
// placeholders, whose value cannot be split back into its parts
// unambiguously (address their clients by token instead, see ParseToken).
func (d *Deriver) TokenFor(i int, raw string) (tok Token, ok bool) {
	if i < 0 || i >= len(d.cands) || raw == "" {
		return Token{}, false
	}
	c := &d.cands[i]
	if len(c.parts) == 1 && c.parts[0].ph != "" {
		if tok, ok := d.addrToken(i, raw); ok {
			return tok, true
		}
		return hashToken(i, []byte(raw)), true
	}
	ph, prefix, suffix, n := "", "", "", 0
	for _, p := range c.parts {
		switch {
		case p.ph != "":
			ph = p.ph
			n++
		case n == 0:
			prefix += p.lit
		default:
			suffix += p.lit
		}
	}
	switch n {
	case 0:
		if raw != prefix {
			return Token{}, false
		}
		return hashToken(i, []byte(raw)), true
	case 1:
		if len(raw) <= len(prefix)+len(suffix) || !strings.HasPrefix(raw, prefix) || !strings.HasSuffix(raw, suffix) {
			return Token{}, false
		}
		v := raw[len(prefix) : len(raw)-len(suffix)]
		buf, ok, _ := c.appendValue(oneValue{name: ph, value: v}, nil, nil, d)
		if !ok {
			return Token{}, false
		}
		return hashToken(i, buf), true
	}
	return Token{}, false
}

// oneValue resolves one placeholder.
type oneValue struct{ name, value string }

func (o oneValue) Get(name string) (any, bool) {
	if name == o.name {
		return o.value, true
	}
	return nil, false
}

// EmptyToken returns the token of the zone's shared bucket: the one every
// request whose candidates are all empty counts against.
func EmptyToken() Token {
	var t Token
	t[1] = byte(KindEmpty)
	return t
}

// ParseToken parses a token's text form (Token.String: what logs and store
// keys show, such as "h1-…" or "41-c0000201"). Hex digits may be upper
// case; anything else must be exactly the canonical form.
func ParseToken(s string) (Token, bool) {
	s = strings.ToLower(s)
	dash := strings.IndexByte(s, '-')
	if len(s) < 3 || dash < 2 || dash > 4 {
		return Token{}, false
	}
	n, err := strconv.ParseUint(s[1:dash], 10, 8)
	if err != nil || n > MaxCandidates {
		return Token{}, false
	}
	var t Token
	t[0], t[1] = byte(n), s[0]
	payload := s[dash+1:]
	switch t.Kind() {
	case KindEmpty:
		if n != 0 || payload != "" {
			return Token{}, false
		}
	case KindIPv4:
		if len(payload) != 8 || !decodeHex(t[2:6], payload) {
			return Token{}, false
		}
	case KindIPv6, KindHash, KindScoped:
		if len(payload) != 2*(Size-2) || !decodeHex(t[2:], payload) {
			return Token{}, false
		}
	default:
		return Token{}, false
	}
	// Only the empty bucket, and a scope of it, come from no candidate.
	if n == 0 && t.Kind() != KindEmpty && t.Kind() != KindScoped || t.String() != s {
		return Token{}, false // leading zeros, a "+", or a candidate 0 that is not the empty bucket
	}
	return t, true
}

// decodeHex decodes s, of exactly 2×len(dst) hex digits, into dst.
func decodeHex(dst []byte, s string) bool {
	_, err := hex.Decode(dst, []byte(s))
	return err == nil
}
