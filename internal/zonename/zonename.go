// Package zonename encodes zone names for the places that cannot carry any
// string as it is. A zone name is any non-empty valid UTF-8 string of
// letters, marks, numbers, punctuation, symbols and spaces (the root
// package checks that), so wherever a name has to stay unambiguous it is
// encoded, never trusted:
//
//   - Key: for store keys and admin API path segments. Every byte outside
//     [A-Za-z0-9_.-] is percent-encoded ('%' included), so the result holds
//     no ':', '{', '}', '/' or space, and the names that these characters
//     alone could form before (the only names once accepted) encode to
//     themselves: their Redis keys are unchanged.
//   - Policy: the policy identifier of the IETF RateLimit fields (an
//     sf-string, which carries printable ASCII only). '%' and every byte
//     outside printable ASCII (0x20-0x7E) are percent-encoded; the rest,
//     readable, stays as it is (the sf-string serialisation then escapes
//     '"' and '\').
//
// Both are reversed by url.PathUnescape.
package zonename

const upperhex = "0123456789ABCDEF"

// keySafe and policySafe mark the bytes each encoding keeps as they are.
var keySafe, policySafe [256]bool

func init() {
	for c := 0; c < 256; c++ {
		keySafe[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		policySafe[c] = c >= 0x20 && c <= 0x7e && c != '%'
	}
}

// appendEscaped appends s to b with every byte not in safe percent-encoded.
func appendEscaped(b []byte, s string, safe *[256]bool) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if safe[c] {
			b = append(b, c)
		} else {
			b = append(b, '%', upperhex[c>>4], upperhex[c&15])
		}
	}
	return b
}

// escapedLen is the length of s once encoded with safe, and whether any
// byte needs encoding.
func escapedLen(s string, safe *[256]bool) (int, bool) {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !safe[s[i]] {
			n += 2
		}
	}
	return n, n != len(s)
}

// AppendKey appends name's key form (see the package comment) to b.
func AppendKey(b []byte, name string) []byte { return appendEscaped(b, name, &keySafe) }

// KeyLen returns the length of name's key form, and whether it differs
// from name (false: name is its own key form).
func KeyLen(name string) (int, bool) { return escapedLen(name, &keySafe) }

// Key returns name's key form.
func Key(name string) string {
	if n, enc := KeyLen(name); enc {
		return string(AppendKey(make([]byte, 0, n), name))
	}
	return name
}

// Policy returns name's policy identifier (see the package comment).
func Policy(name string) string {
	if n, enc := escapedLen(name, &policySafe); enc {
		return string(appendEscaped(make([]byte, 0, n), name, &policySafe))
	}
	return name
}
