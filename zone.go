package sluice

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/internal/zonename"
)

// Zone is one rate limit: which requests (match), who (key), and how much
// (max_events per window, with an optional burst).
//
// The limit may be chosen per request (MaxEventsFrom, WindowFrom,
// BurstFrom: a plan's limits, say). The client's bucket then depends on the
// limit resolved: a request whose limit is the zone's default (MaxEvents,
// Window, Burst) counts against the client's plain bucket, and a request
// resolved to any other limit against a bucket of the client's for that
// limit alone (the key's token scoped by the limit; see identity.Token.Scope).
// So a client moved from free to pro gets a full pro-sized bucket at once
// instead of carrying the free bucket's state, and moving back finds its
// free bucket as it left it: switching plans never hands out an allowance
// twice within one plan's window. The cost: what a client spent under one
// limit does not count under another. The number of buckets per client is
// bounded by the number of distinct limits its requests resolve to (the
// plans of a map), and no raw value reaches a key. One bucket per client
// whatever the limit would adapt too (the stores keep what a client spent,
// so a raised capacity shows at once), but it would mix one state across
// limits that differ in window or algorithm-specific meaning, or by
// endpoint within one zone; a bucket per limit keeps each limit exact.
type Zone struct {
	// Key lists the key candidates, made of placeholders: the first whose
	// placeholders are all non-empty identifies the client, e.g.
	// ["{http.auth.user.id}", "{http.vars.client_ip}"] keys on the account
	// when there is one, else on the client IP. A single string is accepted
	// too. A value that is an IP address is canonicalised and masked to
	// ipv4_prefix / ipv6_prefix; any other value is hashed before it reaches
	// the store or a log. When every candidate is empty, the request counts
	// against one bucket shared by all such requests of the zone. A
	// request header, cookie or query argument in a candidate counts by
	// its one value; a request that carries it several times with
	// different values is refused with 400 (counted as ambiguous_key; a
	// report-only zone passes it uncharged).
	// Default: "{http.vars.client_ip}".
	Key KeyCandidates `json:"key,omitempty"`

	// Window is the period over which MaxEvents are allowed; the token
	// bucket refills MaxEvents per Window, continuously. A whole number of
	// milliseconds, at least 1ms.
	// Required; with WindowFrom, it is the default.
	Window caddy.Duration `json:"window,omitempty"`

	// MaxEvents is the number of events allowed per Window. Required; with
	// MaxEventsFrom, it is the default.
	MaxEvents int64 `json:"max_events,omitempty"`

	// Burst is the token bucket's capacity: how many events a client that
	// has been idle may spend at once. Default: MaxEvents (the resolved
	// one, when MaxEventsFrom is set); with BurstFrom, required as the
	// default.
	Burst int64 `json:"burst,omitempty"`

	// MaxEventsFrom chooses MaxEvents per request: a placeholder, such as
	// {plan_events} set by a `map` from the API key, or a header that
	// forward_auth copies from the authentication service's answer, whose
	// value is a positive integer. MaxEvents is the default: it applies
	// when the value is empty or unusable, and such a value is logged (at
	// most once a minute per zone) and counted
	// (caddy_rate_limit_dynamic_fallbacks_total). Take limits only from
	// values the client cannot choose. See Zone for how a per-request limit
	// chooses the client's bucket.
	MaxEventsFrom string `json:"max_events_from,omitempty"`

	// WindowFrom chooses Window per request, like MaxEventsFrom: the value
	// is whole numbers with units ms, s, m, h or d (500ms, 30s, 1m, 1h,
	// 1d, 1h30m). Window is the default.
	WindowFrom string `json:"window_from,omitempty"`

	// BurstFrom chooses Burst per request, like MaxEventsFrom (token_bucket
	// and gcra only). Burst is the default, and is then required.
	BurstFrom string `json:"burst_from,omitempty"`

	// Algorithm is the rate limiting algorithm. Default: "token_bucket".
	Algorithm string `json:"algorithm,omitempty"`

	// MatcherSetsRaw selects the requests the zone applies to; the sets are
	// OR'ed, the matchers within a set AND'ed. Default: every request that
	// reaches the handler.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// IPv4Prefix is the prefix length an IPv4 key is masked to; 0 means
	// not set. Default: 32.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix is the prefix length an IPv6 key is masked to, so that one
	// client cannot rotate through its /64 for fresh buckets; 0 means not
	// set. Default: 64.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// Cost is what one request spends: an integer (default 1), or a
	// placeholder resolved per request, such as {cost} set by a map, or
	// {http.request.header.X-Cost}. A static cost larger than the zone's
	// capacity is a config error; a per-request cost larger than the
	// capacity is refused (it could never pass). A per-request value that
	// is not a positive integer counts as CostDefault, and is logged (at
	// most once a minute per zone) and counted
	// (caddy_rate_limit_dynamic_fallbacks_total).
	Cost caddyhttp.WeakString `json:"cost,omitempty"`

	// CostDefault is what a request spends when the Cost placeholder's
	// value is not a positive integer. Only with a placeholder Cost.
	// Default: 1.
	CostDefault int64 `json:"cost_default,omitempty"`

	// Enabled switches one zone off (false): it is compiled and checked but
	// decides nothing, so a reload can flip it. Default: true.
	Enabled *bool `json:"enabled,omitempty"`

	// ReportOnly makes the zone decide and record without ever refusing:
	// its state evolves exactly as under enforcement (a would-be refusal
	// charges nothing), its headers are sent, and every would-be refusal
	// is logged and counted (outcome report_only_refused), so that its
	// count is what enforcing it would refuse. For rolling a limit out.
	ReportOnly bool `json:"report_only,omitempty"`

	// Fail is what the zone does when a shared store cannot answer in time
	// (unreachable, slow, or erroring, or its circuit breaker open: then at
	// once, with no timeout paid): "open" lets the request through
	// unmetered (logged and counted), "closed" refuses it with 503 and
	// Retry-After, "local" enforces the zone in this instance's memory
	// until the store answers again. With "local", during an outage N
	// instances admit up to N times the limit (each counts alone, from
	// zero: what the store had counted is not known locally); when the
	// breaker closes the store decides again from its own state, which
	// never saw what the instances counted meanwhile. The memory store
	// never fails. Default: "open".
	Fail string `json:"fail,omitempty"`
}

// Fail policies.
const (
	failOpenPolicy   = "open"
	failClosedPolicy = "closed"
	failLocalPolicy  = "local"
)

// KeyCandidates is a list of key candidates; in JSON, a single string is
// accepted for compatibility with caddy-ratelimit.
type KeyCandidates []string

// UnmarshalJSON accepts a string or a list of strings.
func (k *KeyCandidates) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*k = KeyCandidates{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("key must be a string or a list of strings")
	}
	*k = many
	return nil
}

// MarshalJSON writes a single candidate as a string.
func (k KeyCandidates) MarshalJSON() ([]byte, error) {
	if len(k) == 1 {
		return json.Marshal(k[0])
	}
	return json.Marshal([]string(k))
}

// Defaults.
const (
	defaultKey        = "{http.vars.client_ip}"
	defaultIPv4Prefix = 32
	defaultIPv6Prefix = 64
	// maxZoneNameLen bounds a zone name, in bytes: the name travels in the
	// RateLimit-Policy and RateLimit fields of every response (up to three
	// times as long once percent-encoded), and proxies commonly cap a
	// response's header section at 4 or 8 KB.
	maxZoneNameLen = 256
)

// zone is a Zone compiled at Provision: the hot path parses nothing.
type zone struct {
	name     string
	limit    algorithms.Limit
	cost     int64
	matchers caddyhttp.MatcherSets
	deriver  *identity.Deriver
	fail     string
	// costExpr is the per-request cost placeholder, or nil for a static
	// cost (cost is then the default).
	costExpr *identity.Candidate
	// dyn is the limit chosen per request, or nil for a static limit: then
	// nothing about the limit is parsed per request.
	dyn *dynamicLimit
	// dynSpec renders dyn's placeholders ("" for a static limit), for the
	// check that every use of a zone name carries the same limit.
	dynSpec string
	// badValue rate-limits the log line about unusable per-request values
	// (cost, events, window, burst): one line a minute per zone.
	badValue *errorLog
	// policyItem is this zone's RateLimit-Policy list member, formatted once.
	policyItem string
	// metrics are the zone's counters; nil with disable_metrics.
	metrics    *zoneMetrics
	reportOnly bool
	// limitText is X-RateLimit-Limit's value, formatted once.
	limitText string
	// The name as each sink carries it (see setNames): JSON-escaped (without
	// the quotes), the policy identifier of the IETF RateLimit fields, that
	// identifier as a serialised sf-string and as a JSON string (both with
	// their quotes).
	jsonName, policyID, sfName, jsonPolicyID string
}

// validZoneName reports whether a zone name may be used. Any name
// caddy-ratelimit accepts is accepted (a name is one string, in a
// Caddyfile quoted where it holds spaces), except:
//
//   - the empty name;
//   - a name longer than maxZoneNameLen bytes;
//   - a name that is not valid UTF-8: a Prometheus label value must be, and
//     JSON bodies and logs carry text;
//   - a name with a character that is not graphic (letters, marks,
//     numbers, punctuation, symbols and spaces are): control characters
//     (C0, DEL, C1), format characters (bidirectional overrides,
//     zero-width ones) and private-use or unassigned code points. They are
//     invisible or reorder text in logs, error messages and the admin API
//     listing, where they could disguise one zone as another, and no name
//     needs one.
//
// Every sink that cannot carry a name as it is encodes it: store keys and
// admin API paths (internal/zonename.AppendKey), the draft header fields
// (zonename.Policy, then sf-string escaping), JSON bodies and the
// handle_errors message (JSON escaping). Metric labels, log fields and the
// placeholders carry the name as it is.
func validZoneName(name string) error {
	switch {
	case name == "":
		return errors.New("zone name must not be empty")
	case len(name) > maxZoneNameLen:
		return fmt.Errorf("zone name %.40q... is longer than %d bytes", name, maxZoneNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("zone name %q is not valid UTF-8", name)
	}
	for _, r := range name {
		if !unicode.IsGraphic(r) {
			return fmt.Errorf("zone name %q: %U is a control, format, private-use or unassigned character; only letters, marks, numbers, punctuation, symbols and spaces are allowed", name, r)
		}
	}
	return nil
}

// setNames fills in the forms of z's name each sink carries.
func (z *zone) setNames() {
	z.jsonName = jsonEscape(z.name)
	z.policyID = zonename.Policy(z.name)
	z.sfName = sfString(z.policyID)
	z.jsonPolicyID = `"` + jsonEscape(z.policyID) + `"`
}

// setDefaults fills in the zone's defaults.
func (z *Zone) setDefaults() {
	if len(z.Key) == 0 {
		z.Key = KeyCandidates{defaultKey}
	}
	if z.IPv4Prefix == 0 {
		z.IPv4Prefix = defaultIPv4Prefix
	}
	if z.IPv6Prefix == 0 {
		z.IPv6Prefix = defaultIPv6Prefix
	}
	if z.Fail == "" {
		z.Fail = failOpenPolicy
	}
}

// limit compiles the zone's limit, with errors naming the field.
func (z *Zone) limit() (algorithms.Limit, error) {
	alg, err := algorithms.ParseAlgorithm(z.Algorithm)
	if err != nil {
		return algorithms.Limit{}, fmt.Errorf("algorithm: %w", err)
	}
	switch {
	case z.MaxEvents == 0:
		return algorithms.Limit{}, errors.New("events (max_events) is required")
	case z.MaxEvents < 0:
		return algorithms.Limit{}, fmt.Errorf("events (max_events) must be positive, got %d", z.MaxEvents)
	case z.Window == 0:
		return algorithms.Limit{}, errors.New("window is required")
	case time.Duration(z.Window) < time.Millisecond:
		return algorithms.Limit{}, fmt.Errorf("window must be at least 1ms, got %s", time.Duration(z.Window))
	case time.Duration(z.Window)%time.Millisecond != 0:
		// Refused rather than truncated: 1500us read as 1ms nearly doubles
		// the rate.
		w := time.Duration(z.Window)
		return algorithms.Limit{}, fmt.Errorf("window must be a whole number of milliseconds (the limiter's resolution), got %s; use %s", w, w.Truncate(time.Millisecond)+time.Millisecond)
	case z.Burst < 0:
		return algorithms.Limit{}, fmt.Errorf("burst must be positive, got %d", z.Burst)
	}
	l, err := algorithms.NewLimit(alg, z.MaxEvents, time.Duration(z.Window), z.Burst)
	if err != nil {
		return l, fmt.Errorf("events/window/burst: %w", err)
	}
	return l, nil
}

// compile builds the zone's runtime form. Matchers are loaded by the caller.
func (z *Zone) compile(name string) (*zone, error) {
	if err := validZoneName(name); err != nil {
		return nil, err
	}
	l, err := z.limit()
	if err != nil {
		return nil, err
	}
	if z.IPv4Prefix < 1 || z.IPv4Prefix > 32 {
		return nil, fmt.Errorf("ipv4_prefix must be between 1 and 32, got %d", z.IPv4Prefix)
	}
	if z.IPv6Prefix < 1 || z.IPv6Prefix > 128 {
		return nil, fmt.Errorf("ipv6_prefix must be between 1 and 128, got %d", z.IPv6Prefix)
	}
	switch z.Fail {
	case failOpenPolicy, failClosedPolicy, failLocalPolicy:
	default:
		return nil, fmt.Errorf("fail: unknown policy %q (known: open, closed, local)", z.Fail)
	}
	cands := make([]identity.Candidate, 0, len(z.Key))
	for _, k := range z.Key {
		c, err := identity.Compile(k)
		if err != nil {
			return nil, fmt.Errorf("key: %w", err)
		}
		cands = append(cands, c)
	}
	der, err := identity.NewDeriver(cands, z.IPv4Prefix, z.IPv6Prefix)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	zn := &zone{
		name:       name,
		limit:      l,
		cost:       1,
		deriver:    der,
		fail:       z.Fail,
		reportOnly: z.ReportOnly,
		limitText:  strconv.FormatInt(l.Capacity(), 10),
	}
	zn.setNames()
	if err := zn.compileCost(string(z.Cost), z.CostDefault); err != nil {
		return nil, err
	}
	zn.policyItem = zn.formatPolicyItem(l)
	if err := zn.compileDynamic(z); err != nil {
		return nil, err
	}
	if zn.costExpr != nil || zn.dyn != nil {
		zn.badValue = new(errorLog)
	}
	return zn, nil
}

// compileCost sets the zone's static cost or its per-request placeholder
// and default.
func (z *zone) compileCost(raw string, def int64) error {
	raw = strings.TrimSpace(raw)
	if def != 0 && !strings.Contains(raw, "{") {
		return errors.New("cost_default applies only to a placeholder cost, such as {cost}")
	}
	if def < 0 {
		return fmt.Errorf("cost_default must be a positive integer, got %d", def)
	}
	if def > z.limit.Capacity() {
		return fmt.Errorf("cost_default %d exceeds the zone's capacity %d: no request could ever pass", def, z.limit.Capacity())
	}
	if raw == "" {
		return nil
	}
	if !strings.Contains(raw, "{") {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("cost must be a positive integer or a placeholder, got %q", raw)
		}
		if n > z.limit.Capacity() {
			return fmt.Errorf("cost %d exceeds the zone's capacity %d: no request could ever pass", n, z.limit.Capacity())
		}
		z.cost = n
		return nil
	}
	c, err := identity.Compile(raw)
	if err != nil {
		return fmt.Errorf("cost: %w", err)
	}
	if c.Placeholders() == nil {
		return fmt.Errorf("cost must be a positive integer or a placeholder, got %q", raw)
	}
	z.costExpr = &c
	if def > 0 {
		z.cost = def
	}
	return nil
}

// costOf returns what request r spends in this zone: the static cost, or the
// placeholder's value when it is a positive integer, else the default
// (logged and counted).
func (z *zone) costOf(repl *caddy.Replacer, scratch []byte, logger *zap.Logger) (int64, []byte) {
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

	// views holds the zone as seen under each limit resolved so far (see
	// zone.view), copied on write and read without a lock; at most
	// maxViews entries.
	views atomic.Pointer[map[algorithms.Limit]*zone]
	mu    sync.Mutex // serialises writers of views
}

// maxViews bounds the cached views of one zone: a zone's requests resolve
// to a few limits (its plans). Past the bound (limits taken from arbitrary
// values), each request gets a view of its own, which costs allocations but
// keeps its headers right.
const maxViews = 64

// view returns the zone as a request whose limit is l sees it: z itself for
// the zone's default limit, else a copy whose limit, X-RateLimit-Limit and
// RateLimit-Policy values are l's, formatted once per distinct limit. The
// copy shares everything else (name, key derivation, metrics, policies).
func (z *zone) view(l algorithms.Limit) *zone {
	if l == z.limit || z.dyn == nil {
		return z
	}
	if m := z.dyn.views.Load(); m != nil {
		if v, ok := (*m)[l]; ok {
			return v
		}
	}
	d := z.dyn
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.views.Load()
	if old != nil {
		if v, ok := (*old)[l]; ok {
			return v
		}
	}
	v := new(zone)
	*v = *z
	v.limit = l
	v.limitText = strconv.FormatInt(l.Capacity(), 10)
	v.policyItem = z.formatPolicyItem(l)
	if old != nil && len(*old) >= maxViews {
		return v
	}
	m := make(map[algorithms.Limit]*zone, 1+len(ptrMap(old)))
	for k, e := range ptrMap(old) {
		m[k] = e
	}
	m[l] = v
	d.views.Store(&m)
	return v
}

func ptrMap(m *map[algorithms.Limit]*zone) map[algorithms.Limit]*zone {
	if m == nil {
		return nil
	}
	return *m
}

// dynamicSpec renders the zone's per-request fields ("" when the limit is
// static), for the checks that one zone name carries one limit.
func (z *Zone) dynamicSpec() string {
	var parts []string
	for _, f := range []struct{ name, v string }{
		{"max_events_from", z.MaxEventsFrom}, {"window_from", z.WindowFrom}, {"burst_from", z.BurstFrom},
	} {
		if v := strings.TrimSpace(f.v); v != "" {
			parts = append(parts, f.name+" "+v)
		}
	}
	return strings.Join(parts, " ")
}

// compileDynamic compiles the fields of the limit chosen per request. The
// static fields are then the defaults, already checked by limit.
func (z *zone) compileDynamic(cfg *Zone) error {
	var d dynamicLimit
	for _, f := range []struct {
		field, raw string
		dst        **identity.Candidate
	}{
		{"max_events_from", cfg.MaxEventsFrom, &d.events},
		{"window_from", cfg.WindowFrom, &d.window},
		{"burst_from", cfg.BurstFrom, &d.burst},
	} {
		raw := strings.TrimSpace(f.raw)
		if raw == "" {
			continue
		}
		c, err := identity.Compile(raw)
		if err != nil || c.Placeholders() == nil {
			return fmt.Errorf("%s must be a placeholder, such as {plan_events}, got %q", f.field, raw)
		}
		*f.dst = &c
	}
	if d.events == nil && d.window == nil && d.burst == nil {
		return nil
	}
	if d.burst != nil {
		if !z.limit.Algorithm.AllowsBurst() {
			return fmt.Errorf("burst_from: %s: %w", z.limit.Algorithm, algorithms.ErrBurstNotAllowed)
		}
		if z.limit.Burst == 0 {
			return errors.New("burst_from needs a default: set burst too (the burst used when the placeholder's value is unusable)")
		}
	}
	z.dyn = &d
	z.dynSpec = cfg.dynamicSpec()
	return nil
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

// limitOf returns the limit of a request in this zone, and its key token:
// each per-request field resolved and parsed, an unusable value replaced by
// the zone's default for that field, and a combination that fails
// algorithms.Limit.Validate replaced by the zone's whole default limit
// (each logged, at most once a minute per zone, and counted). A limit other
// than the default moves the token to a bucket of its own (Token.Scope).
// Called only for zones with a per-request limit.
func (z *zone) limitOf(repl *caddy.Replacer, tok identity.Token, scratch []byte, logger *zap.Logger) (algorithms.Limit, identity.Token, []byte) {
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
		if z.badValue.due(badCostInterval) {
			z.badValue.writeDue(logger, "rate limit chosen per request is not a valid limit; using the zone's default",
				zap.String("zone", z.name), zap.String("field", fieldNames[fieldLimit]),
				zap.String("resolved", describeLimit(l)), zap.String("default", describeLimit(z.limit)), zap.Error(err))
		}
		return z.limit, tok, scratch
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

// fallback logs (rate-limited) and counts a per-request value that could
// not be used.
// The fields are built only for a line that is written: a misconfigured
// placeholder falls back on every request, and must not allocate each time.
// resolveField resolves one per-request field (nil ph: none, def stands):
// its value parsed by parse, or def when unusable (logged and counted by
// fallback). It returns the value and scratch, the buffer it used.
func (z *zone) resolveField(repl *caddy.Replacer, logger *zap.Logger, field int, ph *identity.Candidate, parse func([]byte) (int64, bool), def int64, scratch []byte) (int64, []byte) {
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

func (z *zone) fallback(logger *zap.Logger, field int, ph *identity.Candidate, v []byte, def int64) {
	z.countFallback(field)
	if !z.badValue.due(badCostInterval) {
		return
	}
	what := "cost"
	if field != fieldCost {
		what = "limit (" + fieldNames[field] + ")"
	}
	z.badValue.writeDue(logger, "rate limit "+what+" chosen per request is empty or unusable; using the zone's default",
		zap.String("zone", z.name), zap.String("field", fieldNames[field]), zap.String("placeholder", ph.String()),
		zap.String("value", string(v)), zap.Int64("default", def))
}

// due reports whether a line may be written now (at most one per every),
// counting the line as suppressed when not: errorLog.write's rule, for a
// caller whose fields cost something to build (it checks due first, then
// builds them and writes with writeDue).
func (e *errorLog) due(every time.Duration) bool {
	now := time.Now().UnixNano()
	last := e.last.Load()
	if now-last < int64(every) || !e.last.CompareAndSwap(last, now) {
		e.suppressed.Add(1)
		return false
	}
	return true
}

// writeDue writes a warning that due admitted.
func (e *errorLog) writeDue(logger *zap.Logger, msg string, fields ...zap.Field) {
	if ce := logger.Check(zap.WarnLevel, msg); ce != nil {
		ce.Write(append(fields, zap.Int64("suppressed_since_last", e.suppressed.Swap(0)))...)
	}
}

func (z *zone) countFallback(field int) {
	if z.metrics != nil && z.metrics.fallbacks != nil {
		z.metrics.fallbacks[field].Inc()
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

// clientIPHeaders are request headers that carry a client address set by a
// proxy or CDN, and by anyone who reaches Caddy directly.
var clientIPHeaders = []string{"x-forwarded-for", "x-real-ip", "forwarded", "cf-connecting-ip",
	"true-client-ip", "x-client-ip", "fastly-client-ip", "x-cluster-client-ip", "x-original-forwarded-for"}

// spoofableHeader reports whether a placeholder reads one of clientIPHeaders.
func spoofableHeader(ph string) bool {
	name, ok := strings.CutPrefix(strings.ToLower(ph), "http.request.header.")
	return ok && slices.Contains(clientIPHeaders, name)
}

// keyWarnings explains, once at Provision, keys that limit the wrong client
// or merge clients silently.
func (z *Zone) keyWarnings() []string {
	var out []string
	never := false
	for _, k := range z.Key {
		c, err := identity.Compile(k)
		if err != nil {
			continue
		}
		never = never || c.NeverEmpty()
		for _, ph := range c.Placeholders() {
			switch {
			case ph == "http.request.remote.host" || ph == "http.request.remote":
				out = append(out, "key uses {"+ph+"}, the TCP peer: behind a proxy or CDN every client shares the proxy's bucket; use {client_ip} with the trusted_proxies server option")
			case spoofableHeader(ph):
				out = append(out, "key uses {"+ph+"}, which any client can set to get a fresh bucket per request; use {client_ip} with the trusted_proxies server option")
			}
		}
	}
	if !never {
		out = append(out, "no key candidate is always present (such as {client_ip}): requests where every candidate is empty share one bucket for the whole zone")
	}
	return out
}
