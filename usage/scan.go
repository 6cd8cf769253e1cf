// Package usage reads the amounts a response reports (settle's usage) as
// its body streams, holding none of it: a JSON byte scanner that finds the
// number or string at a dot path, a Reader that sums several paths over a
// JSON body, a text/event-stream or NDJSON lines, and the request side of
// asking a stream for its usage (a request's rewrite, the usage event kept
// from the client). It takes bytes and values; it knows no zone and no
// request. docs/architecture.md says where settle calls it.
package usage

import (
	"bytes"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Scan finds the whole number at a dot path (usage.total_tokens) in a
// JSON text fed to it in pieces, as they stream, holding none of the text:
// it tracks the nesting, compares keys on the path byte by byte, and keeps
// only the digits of the number it looks for. Arrays are walked through,
// never on the path. Bad JSON stops it (failed); the amount read before
// stays.
type Scan struct {
	path []string
	st   scanState
	// depth is how many containers are open; on how many of them, from
	// the root, are on the path (on ≤ depth); arrays marks which levels
	// are arrays, a bit per level.
	depth, on int
	arrays    uint64
	// key: the key being read matches path[on-1] so far (keyAt bytes);
	// keyOn: the last key read in an object on the path matched.
	keyAt        int
	keyOK, keyOn bool
	// escaped: the next byte of a string is escaped.
	escaped bool
	// target: the number being read is the one at the path; num holds its
	// digits' value (the fraction's included, frac of them, its trailing
	// zeros pending in zeros), exp its exponent; nst is where the number's
	// grammar is. bad: an unusable amount (not whole, a sign, more than
	// 2^53, or not a number).
	target           bool
	num              int64
	frac, zeros, exp int
	expNeg           bool
	nst              numState
	// found is set once the amount is read (value), bad once the value at
	// the path is unusable; failed once the text is not JSON; done once
	// the root value is complete.
	found, bad, failed, done bool
	value                    int64
	// text, when wanted (wantText: a request's field read by a key), is
	// the string at the path, at most maxScanText bytes; a string with an
	// escape is unusable (bad).
	wantText, inText, isText bool
	text                     []byte
}

// maxScanText bounds a string value read at a path.
const maxScanText = 256

type scanState uint8

const (
	scanValue    scanState = iota // a value is due
	scanFirstKey                  // after '{': a key or '}'
	scanKey                       // after ',' in an object: a key
	scanColon                     // after a key
	scanAfter                     // after a value: ',', '}' or ']'
	scanFirstVal                  // after '[': a value or ']'
	scanString                    // in a string value
	scanKeyStr                    // in a key
	scanNumber                    // in a number
	scanLiteral                   // in true, false or null
)

// numState is where a number's grammar (RFC 8259) is.
type numState uint8

const (
	numSign  numState = iota // after '-': a digit is due
	numZero                  // the integer part is 0
	numInt                   // in the integer part
	numDot                   // after '.': a digit is due
	numFrac                  // in the fraction
	numE                     // after 'e': a sign or a digit is due
	numESign                 // after the exponent's sign: a digit is due
	numExp                   // in the exponent
)

// maxScanDepth is the deepest nesting Scan follows (a bit per level).
const maxScanDepth = 64

// MaxAmount is the largest amount read: 2^53 (algorithms.MaxSettled).
const MaxAmount = algorithms.MaxSettled

// Reset readies s for a new text at path; with text, a string at the path
// is read too (Text).
func (s *Scan) Reset(path []string, text bool) {
	*s = Scan{path: path, wantText: text}
}

// Found reports whether the value at the path was read, Value the number
// (0 for a string).
func (s *Scan) Found() bool  { return s.found }
func (s *Scan) Value() int64 { return s.value }

// Text returns the string read at the path (Reset with text), and whether
// the value read is a string.
func (s *Scan) Text() ([]byte, bool) { return s.text, s.isText }

// Feed scans p, the next bytes of the text. A string value's bytes are
// skipped up to its next quote or backslash at once.
func (s *Scan) Feed(p []byte) {
	for i := 0; i < len(p) && !s.failed; i++ {
		if s.st == scanString && !s.escaped && !s.inText {
			j := bytes.IndexAny(p[i:], `"\`)
			if j < 0 {
				return
			}
			i += j
		}
		s.byte(p[i])
	}
}

// End tells s the text has ended: a number at its very end is complete
// only as the whole text (inside a container, the text was cut short, and
// so may the number have been).
func (s *Scan) End() {
	if s.st == scanNumber && s.depth == 0 {
		if s.endNumber() {
			s.afterValue()
		}
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (s *Scan) byte(c byte) {
	switch s.st {
	case scanString, scanKeyStr:
		s.stringByte(c)
		return
	case scanNumber:
		if s.numByte(c) || !s.endNumber() {
			return
		}
		s.afterValue()
	case scanLiteral:
		if c >= 'a' && c <= 'z' {
			return
		}
		s.afterValue()
	}
	if isSpace(c) {
		return
	}
	switch s.st {
	case scanValue, scanFirstVal:
		if c == ']' && s.st == scanFirstVal {
			s.close(c)
			return
		}
		s.value1(c)
	case scanFirstKey, scanKey:
		switch {
		case c == '"':
			s.st, s.keyAt, s.escaped = scanKeyStr, 0, false
			s.keyOK = s.on == s.depth && s.on > 0
		case c == '}' && s.st == scanFirstKey:
			s.close(c)
		default:
			s.failed = true
		}
	case scanColon:
		if c != ':' {
			s.failed = true
			return
		}
		s.st = scanValue
	case scanAfter:
		switch {
		case s.depth == 0:
			s.failed = true // text after the root value
		case c == ',' && s.arrays&(1<<s.depth) != 0:
			s.st = scanValue
		case c == ',':
			s.st = scanKey
		case c == '}' || c == ']':
			s.close(c)
		default:
			s.failed = true
		}
	}
}

// value1 starts a value with its first byte c.
func (s *Scan) value1(c byte) {
	inObject := s.depth > 0 && s.arrays&(1<<s.depth) == 0
	onPath := s.on == s.depth && (s.depth == 0 || inObject && s.keyOn)
	s.keyOn = false
	atTarget := onPath && s.depth == len(s.path)
	switch {
	case c == '{' || c == '[':
		if s.depth+1 >= maxScanDepth {
			s.failed = true
			return
		}
		if atTarget {
			s.bad = true
		}
		s.depth++
		if c == '[' {
			s.arrays |= 1 << s.depth
			s.st = scanFirstVal
		} else {
			s.arrays &^= 1 << s.depth
			s.st = scanFirstKey
			if onPath && !atTarget {
				s.on++
			}
		}
	case c == '"':
		s.st, s.escaped = scanString, false
		switch {
		case atTarget && s.wantText:
			s.inText, s.isText, s.text = true, true, s.text[:0]
		case atTarget:
			s.bad = true
		}
	case c == '-' || c >= '0' && c <= '9':
		s.st, s.target, s.num, s.nst = scanNumber, atTarget, 0, numSign
		s.frac, s.zeros, s.exp, s.expNeg = 0, 0, 0, false
		if c == '-' {
			s.bad = s.bad || atTarget // negative
		} else {
			s.numByte(c)
		}
	case c == 't' || c == 'f' || c == 'n':
		s.st = scanLiteral
		if atTarget {
			s.bad = true
		}
	default:
		s.failed = true
	}
}

// numByte reads c in a number, and reports whether c is part of it (a
// byte the grammar refuses is, and fails the text: 0040, 1., 1e).
func (s *Scan) numByte(c byte) bool {
	if c >= '0' && c <= '9' {
		d := int64(c - '0')
		switch s.nst {
		case numSign:
			s.nst = numInt
			if d == 0 {
				s.nst = numZero
			}
			s.digit(d)
		case numZero:
			s.bad, s.failed = s.bad || s.target, true // a leading zero is not JSON
		case numInt:
			s.digit(d)
		case numDot, numFrac:
			s.nst = numFrac
			if d == 0 {
				s.zeros++ // counted once a digit other than 0 follows
				break
			}
			for range s.zeros {
				s.digit(0)
			}
			s.digit(d)
			s.frac += s.zeros + 1
			s.zeros = 0
		default: // numE, numESign, numExp
			s.nst = numExp
			if s.exp < 1<<20 {
				s.exp = s.exp*10 + int(d)
			}
		}
		return true
	}
	switch {
	case c == '.' && (s.nst == numZero || s.nst == numInt):
		s.nst = numDot
	case (c == 'e' || c == 'E') && (s.nst == numZero || s.nst == numInt || s.nst == numFrac):
		s.nst = numE
	case (c == '+' || c == '-') && s.nst == numE:
		s.nst, s.expNeg = numESign, c == '-'
	case c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-':
		s.bad, s.failed = s.bad || s.target, true
	default:
		return false
	}
	return true
}

// digit adds a digit to the target's value.
func (s *Scan) digit(d int64) {
	if s.target && !s.bad {
		if s.num = s.num*10 + d; s.num > MaxAmount {
			s.bad = true
		}
	}
}

// endNumber ends the number just read: one cut short (1., 1e, -) fails
// the text; the one at the path is recorded when it is a whole number
// (1E2 and 100.0 are 100; 1.5 is not whole).
func (s *Scan) endNumber() bool {
	switch s.nst {
	case numSign, numDot, numE, numESign:
		s.bad, s.failed = s.bad || s.target, true
		return false
	}
	if s.target && !s.bad {
		if v, ok := s.whole(); ok {
			s.found, s.value = true, v
		} else {
			s.bad = true
		}
	}
	s.target = false
	return true
}

// whole returns the target's value, if it is a whole number up to 2^53.
func (s *Scan) whole() (int64, bool) {
	n, e := s.num, s.exp
	if s.expNeg {
		e = -e
	}
	if e -= s.frac; n == 0 {
		return 0, true
	}
	for ; e > 0; e-- {
		if n *= 10; n > MaxAmount {
			return 0, false
		}
	}
	for ; e < 0; e++ {
		if n%10 != 0 {
			return 0, false
		}
		n /= 10
	}
	return n, true
}

// stringByte reads one byte of a string (a key or a value).
func (s *Scan) stringByte(c byte) {
	if s.escaped {
		s.escaped = false
		s.keyOK = false // an escaped key is never on the path
		return
	}
	if s.inText {
		switch {
		case c == '"':
			s.inText, s.found = false, !s.bad
		case c == '\\' || len(s.text) == maxScanText:
			s.bad = true
		default:
			s.text = append(s.text, c)
		}
	}
	switch c {
	case '\\':
		s.escaped = true
	case '"':
		if s.st == scanKeyStr {
			s.keyOn = s.keyOK && s.keyAt == len(s.path[s.on-1])
			s.st = scanColon
			return
		}
		s.afterValue()
	default:
		if s.st == scanKeyStr && s.keyOK {
			seg := s.path[s.on-1]
			s.keyOK = s.keyAt < len(seg) && seg[s.keyAt] == c
			s.keyAt++
		}
	}
}

// afterValue ends a value: the root's is the text's end.
func (s *Scan) afterValue() {
	s.st = scanAfter
	if s.depth == 0 {
		s.done = true
	}
}

// close closes the innermost container with c ('}' or ']').
func (s *Scan) close(c byte) {
	isArray := s.arrays&(1<<s.depth) != 0
	if isArray != (c == ']') {
		s.failed = true
		return
	}
	if s.on == s.depth {
		s.on--
	}
	s.depth--
	s.afterValue()
}
