package sluice

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
)

// Zone is one rate limit: which requests (match), who (key), and how much
// (max_events per window, with an optional burst).
type Zone struct {
	// Key lists the key candidates, made of placeholders: the first whose
	// placeholders are all non-empty identifies the client, e.g.
	// ["{http.auth.user.id}", "{http.vars.client_ip}"] keys on the account
	// when there is one, else on the client IP. A single string is accepted
	// too. A value that is an IP address is canonicalised and masked to
	// ipv4_prefix / ipv6_prefix; any other value is hashed before it reaches
	// the store or a log. When every candidate is empty, the request counts
	// against one bucket shared by all such requests of the zone.
	// Default: "{http.vars.client_ip}".
	Key KeyCandidates `json:"key,omitempty"`

	// Window is the period over which MaxEvents are allowed; the token
	// bucket refills MaxEvents per Window, continuously. Resolution: 1ms.
	// Required.
	Window caddy.Duration `json:"window,omitempty"`

	// MaxEvents is the number of events allowed per Window. Required.
	MaxEvents int64 `json:"max_events,omitempty"`

	// Burst is the token bucket's capacity: how many events a client that
	// has been idle may spend at once. Default: MaxEvents.
	Burst int64 `json:"burst,omitempty"`

	// Algorithm is the rate limiting algorithm. Default: "token_bucket".
	Algorithm string `json:"algorithm,omitempty"`

	// MatcherSetsRaw selects the requests the zone applies to; the sets are
	// OR'ed, the matchers within a set AND'ed. Default: every request that
	// reaches the handler.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// IPv4Prefix is the prefix length an IPv4 key is masked to. Default: 32.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix is the prefix length an IPv6 key is masked to, so that one
	// client cannot rotate through its /64 for fresh buckets. Default: 64.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// Cost is what one request spends: an integer (default 1), or a
	// placeholder resolved per request, such as {http.vars.cost} set by a
	// map, or {http.request.header.X-Cost}. A static cost larger than the
	// zone's capacity is a config error; a per-request cost larger than
	// the capacity is refused (it could never pass). A per-request value
	// that is not a positive integer counts as 1 and is logged (at most
	// once a minute per zone).
	Cost caddyhttp.WeakString `json:"cost,omitempty"`

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
	maxZoneNameLen    = 64
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
	// cost; badCost rate-limits the log line about unusable values.
	costExpr *identity.Candidate
	badCost  *errorLog
	// policyItem is this zone's RateLimit-Policy list member, formatted once.
	policyItem string
	// metrics are the zone's counters; nil with disable_metrics.
	metrics    *zoneMetrics
	reportOnly bool
	// limitText is X-RateLimit-Limit's value, formatted once.
	limitText string
}

// validZoneName reports whether a zone name is safe everywhere it goes:
// store keys, header values, JSON bodies, metric labels.
func validZoneName(name string) error {
	if name == "" {
		return errors.New("zone name must not be empty")
	}
	if len(name) > maxZoneNameLen {
		return fmt.Errorf("zone name %q is longer than %d characters", name, maxZoneNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("zone name %q: only letters, digits, '_', '-' and '.' are allowed", name)
		}
	}
	return nil
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
		policyItem: policyItem(name, l),
	}
	if err := zn.compileCost(string(z.Cost)); err != nil {
		return nil, err
	}
	return zn, nil
}

// compileCost sets the zone's static cost or its per-request placeholder.
func (z *zone) compileCost(raw string) error {
	raw = strings.TrimSpace(raw)
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
	z.costExpr = &c
	z.badCost = new(errorLog)
	return nil
}

// costOf returns what request r spends in this zone: the static cost, or the
// placeholder's value when it is a positive integer, else 1 (logged).
func (z *zone) costOf(repl *caddy.Replacer, scratch []byte, logger *zap.Logger) (int64, []byte) {
	if z.costExpr == nil {
		return z.cost, scratch
	}
	v, ok := z.costExpr.AppendValue(repl, scratch[:0])
	n, err := strconv.ParseInt(string(v), 10, 64) // no allocation: the conversion does not escape
	if !ok || err != nil || n < 1 {
		z.badCost.logf(logger, "rate limit cost is not a positive integer; counting 1", zap.String("zone", z.name),
			zap.String("cost", z.costExpr.String()), zap.ByteString("value", v))
		return 1, v
	}
	return n, v
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
