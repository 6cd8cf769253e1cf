package sluice

import (
	"encoding/binary"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// The per-request side of a zone: its cost and limit resolved from
// placeholders, and what responses show of the limit.

// costOf returns what request r spends in this zone: the static cost, or the
// placeholder's value when it is a positive integer, else the default
// (logged and counted).
func (z *zone) costOf(repl identity.Resolver, scratch []byte, logger *zap.Logger) (int64, []byte) {
	if z.costExpr == nil {
		return z.cost, scratch
	}
	v, ok := z.costExpr.AppendValue(repl, scratch[:0])
	n, good := parseCount(v)
	if !ok || !good {
		z.fallback(logger, fieldCost, z.costExpr, v, z.cost)
		return z.cost, v
	}
	return n, v
}

// dynamicLimit is the part of a zone's limit chosen per request: the
// placeholders of the fields that are dynamic, nil for the static ones.
type dynamicLimit struct {
	events, window, burst *identity.Candidate

	// shown keeps what responses show of each limit resolved so far,
	// copied on write and read without a lock; at most maxShown entries.
	shown atomic.Pointer[map[algorithms.Limit]*shownLimit]
	mu    sync.Mutex // serialises writers of shown
}

// shownLimit is what a response shows of the limit its request was decided
// under, formatted once per limit.
type shownLimit struct {
	limit  string // X-RateLimit-Limit
	policy string // the zone's RateLimit-Policy list member
}

// showLimit formats what responses show of limit l in this zone.
func (z *zone) showLimit(l algorithms.Limit) shownLimit {
	return shownLimit{limit: strconv.FormatInt(l.Capacity(), 10), policy: z.formatPolicyItem(l)}
}

// maxShown bounds the limits one zone keeps formatted: a zone's requests
// resolve to a few limits (its plans). Past the bound (limits read from
// arbitrary values), each request formats its own, which costs allocations
// but keeps its headers right.
const maxShown = 64

// shownFor returns what responses show of limit l: the zone's own for its
// default limit, else l's, formatted once.
func (z *zone) shownFor(l algorithms.Limit) *shownLimit {
	if l == z.limit || z.dyn == nil {
		return &z.shown
	}
	d := z.dyn
	if m := d.shown.Load(); m != nil {
		if s, ok := (*m)[l]; ok {
			return s
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var old map[algorithms.Limit]*shownLimit
	if p := d.shown.Load(); p != nil {
		old = *p
	}
	if s, ok := old[l]; ok {
		return s
	}
	s := z.showLimit(l)
	if len(old) >= maxShown {
		return &s
	}
	m := make(map[algorithms.Limit]*shownLimit, len(old)+1)
	maps.Copy(m, old)
	m[l] = &s
	d.shown.Store(&m)
	return &s
}

// Fields of the per-request values, as the metrics' field label and the
// log lines name them.
const (
	fieldEvents = iota
	fieldWindow
	fieldBurst
	fieldCost
	fieldLimit // a combination of resolved values that is not a valid limit
	numFields
)

var fieldNames = [numFields]string{"events", "window", "burst", "cost", "limit"}

// perRequestFields names the fields whose fallbacks zone z counts: every
// one when something is chosen per request, else none.
func perRequestFields(z *zone) []string {
	if z.costExpr == nil && z.dyn == nil {
		return nil
	}
	return fieldNames[:]
}

// limitOf returns the limit of a request in this zone, and its key token:
// each per-request field resolved and parsed, an unusable value replaced by
// the zone's default for that field, and a combination that fails
// algorithms.Limit.Validate replaced by the zone's whole default limit
// (each logged, at most once a minute per zone, and counted). A limit other
// than the default moves the token to a bucket of its own (Token.Scope).
// Called only for zones with a per-request limit.
func (z *zone) limitOf(repl identity.Resolver, tok identity.Token, scratch []byte, logger *zap.Logger) (algorithms.Limit, identity.Token, []byte) {
	l := z.limit
	d := z.dyn
	l.Events, scratch = z.resolveField(repl, logger, fieldEvents, d.events, parseCount, l.Events, scratch)
	l.Window, scratch = z.resolveField(repl, logger, fieldWindow, d.window, parseWindow, l.Window, scratch)
	l.Burst, scratch = z.resolveField(repl, logger, fieldBurst, d.burst, parseCount, l.Burst, scratch)
	if l == z.limit {
		return l, tok, scratch
	}
	if err := l.Validate(); err != nil {
		z.countFallback(fieldLimit)
		if ce := z.badValue.Check(logger, zap.WarnLevel, fallbackMsg[fieldLimit], time.Now()); ce != nil {
			z.badValue.Write(ce, zap.String("zone", z.name), zap.String("field", fieldNames[fieldLimit]),
				zap.String("resolved", zonemodel.DescribeLimit(l)), zap.String("default", zonemodel.DescribeLimit(z.limit)), zap.Error(err))
		}
		return z.limit, tok, scratch
	}
	if l.Algorithm == algorithms.Concurrency {
		return l, tok, scratch // one count of slots per key, whatever its limit
	}
	var sc [25]byte
	return l, tok.Scope(limitScope(&sc, &l)), scratch
}

// limitScope writes the scope of a limit's bucket into b and returns it:
// the limit's algorithm, events, window and burst.
func limitScope(b *[25]byte, l *algorithms.Limit) []byte {
	b[0] = byte(l.Algorithm)
	binary.BigEndian.PutUint64(b[1:], uint64(l.Events))
	binary.BigEndian.PutUint64(b[9:], uint64(l.Window))
	binary.BigEndian.PutUint64(b[17:], uint64(l.Burst))
	return b[:]
}

// resolveField resolves one per-request field (nil ph: none, def stands):
// its value parsed by parse, or def when unusable (logged and counted by
// fallback). It returns the value and scratch, the buffer it used.
func (z *zone) resolveField(repl identity.Resolver, logger *zap.Logger, field int, ph *identity.Candidate, parse func([]byte) (int64, bool), def int64, scratch []byte) (int64, []byte) {
	if ph == nil {
		return def, scratch
	}
	v, ok := ph.AppendValue(repl, scratch[:0])
	if n, good := parse(v); ok && good {
		return n, v
	}
	z.fallback(logger, field, ph, v, def)
	return def, v
}

// fallbackMsg is the log message of an unusable value of each field.
var fallbackMsg = [numFields]string{
	fieldEvents: "rate limit limit (events) chosen per request is empty or unusable; using the zone's default",
	fieldWindow: "rate limit limit (window) chosen per request is empty or unusable; using the zone's default",
	fieldBurst:  "rate limit limit (burst) chosen per request is empty or unusable; using the zone's default",
	fieldCost:   "rate limit cost chosen per request is empty or unusable; using the zone's default",
	fieldLimit:  "rate limit chosen per request is not a valid limit; using the zone's default",
}

// fallback counts a per-request value that could not be used, and logs it
// (at most once a minute per zone). The line's fields are built only when
// it is written: a misconfigured placeholder falls back on every request.
func (z *zone) fallback(logger *zap.Logger, field int, ph *identity.Candidate, v []byte, def int64) {
	z.countFallback(field)
	if ce := z.badValue.Check(logger, zap.WarnLevel, fallbackMsg[field], time.Now()); ce != nil {
		z.badValue.Write(ce, zap.String("zone", z.name), zap.String("field", fieldNames[field]),
			zap.String("placeholder", ph.String()), zap.String("value", string(v)), zap.Int64("default", def))
	}
}

func (z *zone) countFallback(field int) {
	if z.metrics != nil && z.metrics.Fallbacks != nil {
		z.metrics.Fallbacks[field].Inc()
	}
}

// parseCount parses a positive decimal integer (digits only, at most
// 2^62), without allocating.
func parseCount(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, n >= 1 && n <= 1<<62
}

// parseWindow parses a per-request window in milliseconds: whole numbers
// with units ms, s, m, h or d, concatenated ("1h30m"), without allocating.
func parseWindow(b []byte) (int64, bool) {
	var total int64
	if len(b) == 0 {
		return 0, false
	}
	for len(b) > 0 {
		var n int64
		i := 0
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			if n > algorithms.MaxRefill {
				return 0, false
			}
			n = n*10 + int64(b[i]-'0')
		}
		if i == 0 {
			return 0, false
		}
		b = b[i:]
		var unit int64
		switch {
		case len(b) >= 2 && b[0] == 'm' && b[1] == 's':
			unit, b = 1, b[2:]
		case len(b) >= 1 && b[0] == 's':
			unit, b = 1000, b[1:]
		case len(b) >= 1 && b[0] == 'm':
			unit, b = 60_000, b[1:]
		case len(b) >= 1 && b[0] == 'h':
			unit, b = 3_600_000, b[1:]
		case len(b) >= 1 && b[0] == 'd':
			unit, b = 86_400_000, b[1:]
		default:
			return 0, false
		}
		if n > (algorithms.MaxRefill-total)/unit {
			return 0, false // longer than any window can be
		}
		total += n * unit
	}
	return total, total > 0
}
