package sluice

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/identity"
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
		return errors.New("name must not be empty")
	case len(name) > maxZoneNameLen:
		return fmt.Errorf("name is longer than %d bytes", maxZoneNameLen)
	case !utf8.ValidString(name):
		return errors.New("name is not valid UTF-8")
	}
	for _, r := range name {
		if !unicode.IsGraphic(r) {
			return fmt.Errorf("name: %U is a control, format, private-use or unassigned character; only letters, marks, numbers, punctuation, symbols and spaces are allowed", r)
		}
	}
	return nil
}

// zoneErr names the zone in err: quoted (a name may hold spaces or quotes),
// and cut short if it is too long to be a name.
func zoneErr(name string, err error) error {
	if len(name) > maxZoneNameLen {
		return fmt.Errorf("zone %.40q...: %w", name, err)
	}
	return fmt.Errorf("zone %q: %w", name, err)
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
