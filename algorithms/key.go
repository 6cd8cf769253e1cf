package algorithms

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// KeySize is the length of a Key.
const KeySize = 18

// Key is a bounded identity token (package identity derives them; its
// Token is this type): byte 0 is the index+1 of the key candidate that
// produced it (0 for the zone's shared empty-key bucket), byte 1 its
// KeyKind, and the remaining 16 bytes the masked address or a hash. It
// never holds a raw credential; keys from different candidates or kinds
// never collide.
type Key [KeySize]byte

// KeyKind says how a Key was made.
type KeyKind byte

// The key kinds (package identity names them Kind...).
const (
	KeyEmpty KeyKind = 'e' // every candidate was empty: the zone's shared bucket
	KeyIPv4  KeyKind = '4' // a masked IPv4 address (IPv4-mapped IPv6 included)
	KeyIPv6  KeyKind = '6' // a masked IPv6 address
	KeyHash  KeyKind = 'h' // any other value, hashed
	// KeyScoped is a key moved to a bucket of its own by Scope: the
	// payload hashes the original key and the scope.
	KeyScoped KeyKind = 's'
)

// Kind returns how the key was made.
func (k Key) Kind() KeyKind { return KeyKind(k[1]) }

// Candidate returns the index+1 of the candidate that produced the key (0
// for the shared empty-key bucket).
func (k Key) Candidate() int { return int(k[0]) }

// String renders the key for logs and store keys (AppendText).
func (k Key) String() string {
	return string(k.AppendText(make([]byte, 0, 2+2*(KeySize-2)+2)))
}

// AppendText appends the key's text form to b: the kind, the candidate
// number, '-' and the payload in hex (4 bytes for IPv4, none for the empty
// bucket); never the raw value of a hashed key. The form uses only
// [0-9a-z] and '-', so it is safe in any store key (including inside a
// Redis Cluster hash tag) and in any log.
func (k Key) AppendText(b []byte) []byte {
	b = append(b, k[1])
	b = strconv.AppendUint(b, uint64(k[0]), 10)
	b = append(b, '-')
	switch k.Kind() {
	case KeyEmpty:
		return b
	case KeyIPv4:
		return hex.AppendEncode(b, k[2:6])
	}
	return hex.AppendEncode(b, k[2:])
}

// MaxScope bounds the scope Key.Scope accepts, in bytes.
const MaxScope = 64

// Scope returns the key of the same client in a separate bucket named by
// scope: byte 0 (the candidate) is kept, the kind becomes KeyScoped, and
// the payload is SHA-256 of the key and the scope, truncated to 128 bits.
// The same key and scope always give the same result; another scope, or
// another key, gives another key (up to the hash's collisions). The result
// reveals neither the original key nor the scope. Sluice scopes the key of
// a zone whose limit is chosen per request by the limit resolved, so that
// each limit (each plan) has a bucket of its own. Scope does not allocate;
// it panics if scope is longer than MaxScope.
func (k Key) Scope(scope []byte) Key {
	if len(scope) > MaxScope {
		panic("algorithms: scope longer than MaxScope")
	}
	var buf [KeySize + MaxScope]byte
	n := copy(buf[:], k[:])
	n += copy(buf[n:], scope)
	sum := sha256.Sum256(buf[:n])
	var s Key
	s[0] = k[0]
	s[1] = byte(KeyScoped)
	copy(s[2:], sum[:KeySize-2])
	return s
}
