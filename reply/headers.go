package reply

import (
	"net/http"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Header names, in canonical form (as net/http sends them).
const (
	HeaderLimit         = "X-Ratelimit-Limit"
	HeaderRemaining     = "X-Ratelimit-Remaining"
	HeaderReset         = "X-Ratelimit-Reset"
	HeaderPolicy        = "Ratelimit-Policy" // draft-ietf-httpapi-ratelimit-headers
	HeaderState         = "Ratelimit"
	HeaderRetryAfter    = "Retry-After"
	HeaderCacheControl  = "Cache-Control"
	HeaderContentType   = "Content-Type"
	HeaderContentLength = "Content-Length"
)

// headerSet gathers the header values of one response and sets them with
// two allocations however many they are, one for a few (headerBlock): the
// numbers are formatted into one string, and the values share one backing
// array. Each header gets a
// one-element slice whose capacity is also one: a later handler that
// appends to it (Header.Add) gets a new array rather than writing into the
// next header's value, and one that rewrites a value in place (a deferred
// `header` replacement does) touches only that header.
type headerSet struct {
	names  [maxHeaders]string
	values [maxHeaders]string
	spans  [maxHeaders]span // a number's digits; to == 0: text
	n      int
	digits [maxHeaders * 20]byte
	nd     int
	ints   int   // the numbers gathered
	last   int64 // the last of them
	// spare is how many values will be gathered after the first set: its
	// array has room for them.
	spare int
	array []string
}

// headerBlock holds the values of a small set of headers (an allowed
// request's X-RateLimit-*) and their numbers' digits, which the values'
// strings point into and nothing writes once they are made.
type headerBlock struct {
	values [3]string
	digits [40]byte
}

// maxHeaders is the most headers a response of this package sets at once.
const maxHeaders = 9

// span locates a value in a headerSet's digits.
type span struct{ from, to uint8 }

// add gathers the header name (canonical) with the value v.
func (s *headerSet) add(name, v string) {
	s.names[s.n], s.values[s.n], s.spans[s.n] = name, v, span{}
	s.n++
}

// addInt gathers the header name (canonical) with the decimal value v.
func (s *headerSet) addInt(name string, v int64) {
	from := s.nd
	s.nd = len(strconv.AppendInt(s.digits[:from], v, 10))
	s.add(name, "")
	s.spans[s.n-1] = span{uint8(from), uint8(s.nd)}
	s.ints++
	s.last = v
}

// set sets the headers gathered since the last set on h.
func (s *headerSet) set(h http.Header) {
	if s.n == 0 {
		return
	}
	var digits string
	if len(s.array) < s.n && s.ints > 0 && s.n+s.spare <= len(headerBlock{}.values) && s.nd <= len(headerBlock{}.digits) {
		b := new(headerBlock) // the values and their digits in one allocation
		digits = unsafe.String(&b.digits[0], copy(b.digits[:], s.digits[:s.nd]))
		s.array = b.values[:s.n+s.spare]
	} else {
		switch s.ints {
		case 0:
		case 1:
			digits = strconv.FormatInt(s.last, 10) // which allocates nothing below 100
		default:
			digits = string(s.digits[:s.nd])
		}
		if len(s.array) < s.n {
			s.array = make([]string, s.n+s.spare)
		}
	}
	for i := range s.n {
		v := s.values[i]
		if sp := s.spans[i]; sp.to > 0 {
			v = digits[sp.from:sp.to]
		}
		s.array[0] = v
		h[s.names[i]] = s.array[:1:1]
		s.array = s.array[1:]
	}
	s.n, s.nd, s.ints = 0, 0, 0
}

// Limits are the values of one answer's rate limit headers: the most
// constrained zone's X-RateLimit-Limit, -Remaining and -Reset (the Unix
// second at which the key is back to full), and the RateLimit-Policy and
// RateLimit field values covering every zone decided ("" with the draft's
// headers off).
type Limits struct {
	LimitText        string
	Remaining, Reset int64
	Policy, State    string
}

// SetLimitHeaders sets the rate limit headers of an allowed request, as
// configured, on its response's headers hdr.
func (s *Shape) SetLimitHeaders(hdr http.Header, l *Limits) {
	if !s.legacy && l.Policy == "" {
		return // headers off
	}
	var hs headerSet
	s.addLimitHeaders(&hs, hdr, l, false, 0)
	hs.set(hdr)
}

// addLimitHeaders gathers the rate limit headers l (refused or not; retry
// is Retry-After, in seconds), as configured, on a response whose headers
// are hdr: X-RateLimit-Limit, -Remaining and -Reset, unless another
// rate_limit that decided the request first reported a zone at least as
// constrained; and the draft's RateLimit-Policy and RateLimit, after the
// members of any earlier directive.
func (s *Shape) addLimitHeaders(hs *headerSet, hdr http.Header, l *Limits, refused bool, retry int64) {
	if s.legacy && !PriorLegacyWins(hdr, refused, retry, l.Remaining, l.Reset) {
		hs.add(HeaderLimit, l.LimitText)
		hs.addInt(HeaderRemaining, l.Remaining)
		hs.addInt(HeaderReset, l.Reset)
	}
	if l.Policy != "" {
		hs.add(HeaderPolicy, appendToPrior(hdr, HeaderPolicy, l.Policy))
		hs.add(HeaderState, appendToPrior(hdr, HeaderState, l.State))
	}
}

// PriorLegacyWins reports whether the response already carries the
// X-RateLimit-* headers of a zone at least as constrained as this
// directive's verdict (refused or not, with Retry-After retry, remaining
// and reset Unix seconds), ranked as the zones of one directive are
// (Standing): another rate_limit decided the request before this one.
// Without parsable headers (the first directive), it reports false.
func PriorLegacyWins(h http.Header, refused bool, retry, remaining, reset int64) bool {
	rem, ok := headerInt(h, HeaderRemaining)
	if !ok {
		return false
	}
	priorRetry, priorRefused := headerInt(h, HeaderRetryAfter)
	rst, ok := headerInt(h, HeaderReset)
	if !ok && !priorRefused {
		return false
	}
	prior := Standing{Refused: priorRefused, Retry: priorRetry, Remaining: rem, Reset: rst}
	return !Standing{Refused: refused, Retry: retry, Remaining: remaining, Reset: reset}.Tighter(prior)
}

// headerInt parses the header's value, a decimal integer as this package
// writes them, without allocating.
func headerInt(h http.Header, name string) (int64, bool) {
	v := h[name]
	if len(v) != 1 || v[0] == "" || len(v[0]) > 19 {
		return 0, false
	}
	s, neg := v[0], false
	if s[0] == '-' {
		s, neg = s[1:], true
	}
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// appendToPrior returns v, or, when the response already carries the field
// (another rate_limit decided the request), its value with v's list
// members appended.
func appendToPrior(h http.Header, name, v string) string {
	prior := h[name]
	if len(prior) == 0 || len(prior) == 1 && prior[0] == "" {
		return v
	}
	return strings.Join(prior, ", ") + ", " + v
}

// PolicyItem is a zone's RateLimit-Policy list member under limit l, as
// draft-ietf-httpapi-ratelimit-headers-11 defines it: the policy identifier
// sfName (SFString), the quota q and the window w (whole seconds; a window
// under a second, or not a whole number of seconds, is rounded up, which
// understates the rate).
//
// The quota unit (qu) is requests, the draft's default, so it is not sent:
// a zone whose requests each cost a static unit counts q (and r) in
// requests, its events divided by unit. A cost chosen per request
// (perRequest, unit 1) cannot be converted: q and r then count cost units,
// which none of the registered units (requests, content-bytes,
// concurrent-requests) names and qu must not name otherwise, so the vendor
// parameter sluice-qu="cost" says so.
func PolicyItem(sfName string, l algorithms.Limit, unit int64, perRequest bool) string {
	w := (l.Window + 999) / 1000
	item := sfName + ";q=" + strconv.FormatInt(l.Events/unit, 10) + ";w=" + strconv.FormatInt(w, 10)
	if perRequest {
		item += `;sluice-qu="cost"`
	}
	return item
}

// AppendMembers appends one zone's members to RateLimit-Policy (pb: its
// policy item, PolicyItem) and RateLimit (sb), after a ", " unless they are
// the first: the available quota r of decision d, in units of unit events
// (see PolicyItem), and, where the decision tells it, the effective window
// t (see effectiveWindow) under limit l for a request of cost.
func AppendMembers(pb, sb []byte, policyItem, sfName string, unit int64, l algorithms.Limit, d *algorithms.Decision, cost int64) ([]byte, []byte) {
	if len(sb) > 0 {
		pb = append(pb, ", "...)
		sb = append(sb, ", "...)
	}
	pb = append(pb, policyItem...)
	sb = append(sb, sfName...)
	sb = append(sb, ";r="...)
	sb = strconv.AppendInt(sb, max(d.Remaining, 0)/unit, 10)
	if t, ok := effectiveWindow(l, d, unit, cost); ok {
		sb = append(sb, ";t="...)
		sb = strconv.AppendInt(sb, t, 10)
	}
	return pb, sb
}

// effectiveWindow is the t parameter of RateLimit (draft -11, 4.1.2) for
// decision d under limit l, r counted in units of unit events: the time
// until the key has more than r units (when full, until a client that spent
// everything now could spend one more), in whole seconds rounded up, never
// 0. ok false: not sent.
//
//   - token_bucket, gcra: the next unit's refill, (Capacity − target)·
//     Window/Events before ResetAfter (at most 1ms late when not exact).
//   - fixed_window: the window's end (ResetAfter), else the whole window.
//   - sliding_window, sliding_log: not sent: the decision does not record
//     when older events leave the window.
//
// On a refusal of a one-unit request it is at most its Retry-After, which
// the draft asks not to end before the effective window.
func effectiveWindow(l algorithms.Limit, d *algorithms.Decision, unit, cost int64) (int64, bool) {
	var ms int64
	switch l.Algorithm {
	case algorithms.TokenBucket, algorithms.GCRA:
		target := (max(d.Remaining, 0)/unit + 1) * unit
		ms = d.ResetAfter.Milliseconds() - floorDiv((l.Capacity()-target)*l.Window, l.Events)
	case algorithms.FixedWindow:
		if ms = d.ResetAfter.Milliseconds(); ms <= 0 {
			ms = l.Window
		}
	default:
		return 0, false
	}
	if !d.Allowed && cost == unit && d.RetryAfter > 0 {
		ms = min(ms, d.RetryAfter.Milliseconds())
	}
	return max(1, (ms+999)/1000), true
}

// floorDiv returns ⌊a/b⌋ for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// ResetUnix is the Unix second, rounded up, at which the key is back to full.
func ResetUnix(now time.Time, after time.Duration) int64 {
	return CeilSeconds(time.Duration(now.UnixNano()) + after)
}

// CeilSeconds rounds a duration up to whole seconds.
func CeilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// SFString serialises s, printable ASCII only (zonename.Policy makes sure),
// as an RFC 9651 sf-string: quoted, with '"' and '\' escaped.
func SFString(s string) string {
	b := make([]byte, 0, len(s)+4)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(append(b, '"'))
}

// Standing is what ranks one zone's decision against another's, to show the
// most constrained: the refusal, the rate limit headers and the admin API's
// peek all rank with Tighter. Retry and Reset may be in any unit (or Reset
// an instant) as long as both sides use the same.
type Standing struct {
	Refused          bool  // an enforced refusal
	Retry            int64 // its Retry-After
	Remaining, Reset int64
}

// Tighter reports whether a is more constrained than b: a refusal beats an
// allowed zone, and between refusals the longer Retry-After; between
// allowed zones the least remaining wins, then the later reset. Equals are
// not tighter, so the first ranked of them stands.
func (a Standing) Tighter(b Standing) bool {
	switch {
	case a.Refused != b.Refused:
		return a.Refused
	case a.Refused:
		return a.Retry > b.Retry
	}
	return a.Remaining < b.Remaining || a.Remaining == b.Remaining && a.Reset > b.Reset
}
