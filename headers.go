package sluice

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
	hdrLimit         = "X-Ratelimit-Limit"
	hdrRemaining     = "X-Ratelimit-Remaining"
	hdrReset         = "X-Ratelimit-Reset"
	hdrPolicy        = "Ratelimit-Policy" // draft-ietf-httpapi-ratelimit-headers
	hdrState         = "Ratelimit"
	hdrRetryAfter    = "Retry-After"
	hdrCacheControl  = "Cache-Control"
	hdrContentType   = "Content-Type"
	hdrContentLength = "Content-Length"
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

// addLimitHeaders gathers the rate limit headers of verdict v (refused or
// not; retry and reset are Retry-After and X-RateLimit-Reset, in seconds),
// as configured, on a response whose headers are hdr: X-RateLimit-Limit,
// -Remaining and -Reset (the Unix second at which the key is back to full),
// unless another rate_limit that decided the request first reported a
// zone at least as constrained; and the draft's RateLimit-Policy and
// RateLimit, after the members of any earlier directive.
func (h *Handler) addLimitHeaders(s *headerSet, hdr http.Header, v *verdict, refused bool, retry, reset int64) {
	if h.legacy && !priorLegacyWins(hdr, refused, retry, v.Remaining, reset) {
		s.add(hdrLimit, v.shown.limit)
		s.addInt(hdrRemaining, v.Remaining)
		s.addInt(hdrReset, reset)
	}
	if v.policy != "" {
		s.add(hdrPolicy, appendToPrior(hdr, hdrPolicy, v.policy))
		s.add(hdrState, appendToPrior(hdr, hdrState, v.state))
	}
}

// priorLegacyWins reports whether the response already carries the
// X-RateLimit-* headers of a zone at least as constrained as this
// directive's verdict (refused or not, with Retry-After retry, remaining
// and reset Unix seconds), ranked as admission.rank ranks the zones of one directive
// (rank.go): another rate_limit decided the request before this one.
// Without parsable headers (the first directive), it reports false.
func priorLegacyWins(h http.Header, refused bool, retry, remaining, reset int64) bool {
	rem, ok := headerInt(h, hdrRemaining)
	if !ok {
		return false
	}
	priorRetry, priorRefused := headerInt(h, hdrRetryAfter)
	rst, ok := headerInt(h, hdrReset)
	if !ok && !priorRefused {
		return false
	}
	prior := standing{refused: priorRefused, retry: priorRetry, remaining: rem, reset: rst}
	return !standing{refused: refused, retry: retry, remaining: remaining, reset: reset}.tighter(prior)
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

// formatPolicyItem is the zone's RateLimit-Policy list member under limit
// l, as draft-ietf-httpapi-ratelimit-headers-11 defines it: the policy
// identifier (see zone.setNames), the quota q and the window w (whole
// seconds; a window under a second, or not a whole number of seconds, is
// rounded up, which understates the rate).
//
// The quota unit (qu) is requests, the draft's default, so it is not sent:
// a zone whose requests each cost a static c counts q (and r) in requests,
// its events divided by c. A cost chosen per request cannot be converted:
// q and r then count cost units, which none of the registered units
// (requests, content-bytes, concurrent-requests) names and qu must not
// name otherwise, so the vendor parameter sluice-qu="cost" says so.
func (z *zone) formatPolicyItem(l algorithms.Limit) string {
	if l.Algorithm == algorithms.Concurrency {
		return z.concurrencyPolicyItem(l) // concurrency.go
	}
	w := (l.Window + 999) / 1000
	item := z.sfName + ";q=" + strconv.FormatInt(l.Events/z.draftUnit(), 10) + ";w=" + strconv.FormatInt(w, 10)
	if z.costExpr != nil {
		item += `;sluice-qu="cost"`
	}
	return item
}

// draftUnit is the size, in the zone's events, of the unit its draft
// fields count in: the static cost, or 1 (a cost chosen per request).
func (z *zone) draftUnit() int64 {
	if z.costExpr != nil {
		return 1
	}
	return z.cost
}

// draftFields formats RateLimit-Policy and RateLimit for every zone decided:
// one list member per zone, with the available quota r (in the zone's
// unit: see formatPolicyItem) and, where the decision tells it, the
// effective window t (see effectiveWindow).
func draftFields(s *admission) (policy, state string) {
	var pb, sb []byte
	var pbuf, sbuf [256]byte
	pb, sb = pbuf[:0], sbuf[:0]
	for i, z := range s.zones {
		if i > 0 {
			pb = append(pb, ", "...)
			sb = append(sb, ", "...)
		}
		pb = append(pb, s.shown[i].policy...)
		d := &s.decs[i]
		unit := z.draftUnit()
		sb = append(sb, z.sfName...)
		sb = append(sb, ";r="...)
		sb = strconv.AppendInt(sb, max(d.Remaining, 0)/unit, 10)
		if t, ok := effectiveWindow(s.reqs[i].Limit, d, unit, s.reqs[i].Cost); ok {
			sb = append(sb, ";t="...)
			sb = strconv.AppendInt(sb, t, 10)
		}
	}
	return string(pb), string(sb)
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

// resetUnix is the Unix second, rounded up, at which the key is back to full.
func resetUnix(now time.Time, after time.Duration) int64 {
	return ceilSeconds(time.Duration(now.UnixNano()) + after)
}

// ceilSeconds rounds a duration up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// sfString serialises s, printable ASCII only (zonename.Policy makes sure),
// as an RFC 9651 sf-string: quoted, with '"' and '\' escaped.
func sfString(s string) string {
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
