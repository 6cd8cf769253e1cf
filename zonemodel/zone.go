// Package zonemodel is a rate_limit zone's configuration (the JSON of
// Handler.RateLimits, which the Caddyfile parser fills), its defaults and
// its compiled form. The handler builds its runtime zones from Compile's
// result, and `caddy rate-limit simulate` reads the same: one schema, one
// set of defaults, one set of checks. It imports nothing of Sluice's but
// algorithms, adaptive and identity.
package zonemodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/identity"
)

// Zone is one rate limit: which requests (match), who (key), and how much
// (max_events per window, with an optional burst). The limit may be chosen
// per request (max_events_from, window_from, burst_from); a client then has
// one bucket per limit its requests resolve to. docs/reference.md ("Zone")
// explains each field and why.
type Zone struct {
	// Key lists the key candidates, placeholders such as
	// "{http.auth.user.id}": the first whose placeholders are all non-empty
	// identifies the client (IPs masked to the prefixes, other values
	// hashed). A single string is accepted. Default: "{http.vars.client_ip}".
	Key KeyCandidates `json:"key,omitempty"`

	// Window is the period of MaxEvents: a whole number of milliseconds, at
	// least 1ms. Required; with WindowFrom, the default.
	Window caddy.Duration `json:"window,omitempty"`

	// MaxEvents is the number of events allowed per Window. Required; with
	// MaxEventsFrom, the default.
	MaxEvents int64 `json:"max_events,omitempty"`

	// Burst is the capacity of token_bucket and gcra: what an idle client
	// may spend at once. Default: MaxEvents; required with BurstFrom.
	Burst int64 `json:"burst,omitempty"`

	// MaxEventsFrom is a placeholder whose value (a positive integer)
	// chooses MaxEvents per request, such as {plan_events} set by a map.
	// An empty or unusable value falls back to MaxEvents.
	MaxEventsFrom string `json:"max_events_from,omitempty"`

	// WindowFrom chooses Window per request, like MaxEventsFrom: whole
	// numbers with units ms, s, m, h or d (1h30m).
	WindowFrom string `json:"window_from,omitempty"`

	// BurstFrom chooses Burst per request, like MaxEventsFrom.
	BurstFrom string `json:"burst_from,omitempty"`

	// Algorithm is token_bucket, gcra, sliding_window, fixed_window or
	// sliding_log. Default: "token_bucket".
	Algorithm string `json:"algorithm,omitempty"`

	// MatcherSetsRaw selects the requests the zone applies to (sets OR'ed,
	// matchers in a set AND'ed). Default: every request.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// IPv4Prefix is the prefix an IPv4 key is masked to, 1 to 32; 0 means
	// not set. Default: 32.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix is the prefix an IPv6 key is masked to, 1 to 128; 0 means
	// not set. Default: 64.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// Cost is what one request spends: a positive integer, at most the
	// capacity, or a placeholder resolved per request. Default: 1.
	Cost caddyhttp.WeakString `json:"cost,omitempty"`

	// CostDefault is the cost when the Cost placeholder's value is not a
	// positive integer; only with a placeholder Cost. Default: 1.
	CostDefault int64 `json:"cost_default,omitempty"`

	// Enabled false switches the zone off (still checked at load).
	// Default: true.
	Enabled *bool `json:"enabled,omitempty"`

	// ReportOnly makes the zone decide, record and send its headers, but
	// never refuse.
	ReportOnly bool `json:"report_only,omitempty"`

	// Fail is what the zone does when a shared store cannot answer: "open"
	// (pass unmetered), "closed" (refuse with 503) or "local" (enforce in
	// this instance's memory). Default: "open".
	Fail string `json:"fail,omitempty"`

	// Count lists the response statuses the zone charges: codes ("401"),
	// classes ("4xx") or ranges ("500-599"). A request is charged before it
	// runs (so it can be refused, atomically with the other zones) and its
	// charge is given back when its response's status is not listed.
	// Default: every response counts.
	Count []string `json:"count,omitempty"`

	// Settle charges what the response reports (tokens): the request takes
	// its Cost (the estimate) before it runs, and once its response tells
	// the actual amount (a header or trailer, or a number in a JSON body or
	// event stream) the zone is settled to it: the difference given back,
	// or charged on top, which may leave the key in debt until the refill
	// repays it. A response without a usable amount keeps the estimate.
	// Rate zones only; not with count or local_allowance. Default: none.
	Settle *Settle `json:"settle,omitempty"`

	// OnExceed is what the zone does with a request it would refuse:
	// "refuse" (429), or "pass": forward it, marked for the next handlers
	// by the placeholders {http.rate_limit.exceeded} (true) and
	// {http.rate_limit.zone}, charged nothing in this zone. Not with
	// ReportOnly. Default: "refuse".
	OnExceed string `json:"on_exceed,omitempty"`

	// Penalty keeps a key refused for this long once the zone refused it,
	// whatever its bucket would allow sooner: a whole number of
	// milliseconds, at least 1ms. Default: none.
	Penalty caddy.Duration `json:"penalty,omitempty"`

	// Delay lets a request the zone would refuse wait for its turn, up to
	// this long, instead (token_bucket and gcra): its slot is reserved at
	// once and it proceeds when its time comes; in an adaptive zone, it
	// waits for a place under the limit. A whole number of milliseconds,
	// at least 1ms. Default: none (refuse).
	Delay caddy.Duration `json:"delay,omitempty"`

	// DelayAfter, with Delay, is how many events of a burst pass at once;
	// the rest are spaced at the rate. At most the capacity. Default: the
	// capacity (burst, else max_events).
	DelayAfter int64 `json:"delay_after,omitempty"`
	// Concurrent makes the zone a concurrency zone: at most this many
	// requests of one key in flight at once (1 to 1000000), each holding a
	// slot from its admission until the handler chain after this one
	// returns. Not with max_events, window, burst, algorithm or cost.
	// With ConcurrentFrom, the default.
	Concurrent int64 `json:"concurrent,omitempty"`

	// ConcurrentFrom chooses Concurrent per request, like MaxEventsFrom
	// (one count of slots per key, whatever the limit resolved).
	ConcurrentFrom string `json:"concurrent_from,omitempty"`

	// Lease is how long a shared store (Redis) keeps a concurrency slot
	// whose instance stopped renewing it (crashed), from 1s to 24h, whole
	// milliseconds; a running request's lease is renewed at half its
	// length. Only with Concurrent. Default: 1m.
	Lease caddy.Duration `json:"lease,omitempty"`

	// Adaptive makes the zone an adaptive concurrency zone (Caddyfile:
	// concurrent adaptive { ... }): at most a learnt number of requests of
	// one key in flight at once on this instance, the limit learnt from the
	// upstream's latency, within Adaptive's bounds. Decided in this
	// instance's memory whatever the store. With Delay, a request over the
	// limit waits up to Delay for a place. Not with the rate fields,
	// Concurrent, Lease, Count or Penalty. Default: none.
	Adaptive *Adaptive `json:"adaptive,omitempty"`

	// LocalAllowance lets each instance draw a hot key's budget from the
	// shared store in small batches and spend them locally, so that a hot
	// key costs the store about one call per batch. Never more than the
	// limit across instances; a request may be refused a little early
	// while another instance holds unspent units (docs/redis.md, "Local
	// allowance"). token_bucket and gcra only, with store redis. Default:
	// off.
	LocalAllowance *LocalAllowance `json:"local_allowance,omitempty"`

	// Sync decides the zone's keys on each instance, without a call to the
	// shared store, from their counts as last read plus the instance's
	// own charges since; every Interval each instance sends its charges
	// and reads the counts back. Over the limit by at most what the other
	// instances admit within about one interval (docs/redis.md, "The
	// asynchronous mode"). fixed_window and sliding_window only, with
	// store redis. Default: off (exact).
	Sync *Sync `json:"sync,omitempty"`

	// MaxOverrides bounds the overrides the zone holds at once (set
	// through the admin API: docs/operating.md, "Overrides"), 1 to
	// 100000. Rate zones only. Default: 1000.
	MaxOverrides int `json:"max_overrides,omitempty"`

	// concurrentZero: the JSON wrote "concurrent": 0, which reads as not
	// set (UnmarshalJSON).
	concurrentZero bool
}

// IsConcurrency reports whether the zone is configured as a concurrency
// zone.
func (z *Zone) IsConcurrency() bool {
	return z.Adaptive != nil || z.Concurrent != 0 || z.ConcurrentFrom != "" || z.Lease != 0
}

// UnmarshalJSON reads a zone as Caddy reads a module (an unknown field is
// an error), noting an explicit "concurrent": 0 so that the check can name
// concurrent rather than the events a rate zone would need.
func (z *Zone) UnmarshalJSON(b []byte) error {
	type plain Zone // without this method
	if err := caddy.StrictUnmarshalJSON(b, (*plain)(z)); err != nil {
		return err
	}
	var set struct {
		Concurrent *int64 `json:"concurrent"`
	}
	z.concurrentZero = json.Unmarshal(b, &set) == nil && set.Concurrent != nil && *set.Concurrent == 0
	return nil
}

// LocalAllowance is a zone's local allowance (Zone.LocalAllowance).
type LocalAllowance struct {
	// MaxBatch caps the units one instance holds for one key (drawn and
	// being drawn). Default, and at most: a tenth of the capacity.
	MaxBatch int64 `json:"max_batch,omitempty"`

	// Expiry is how long drawn units stay spendable; unspent ones are then
	// returned to the store. 10ms to 5s. Default: 100ms.
	Expiry caddy.Duration `json:"expiry,omitempty"`
}

// Fail policies (Zone.Fail).
const (
	FailOpen   = "open"
	FailClosed = "closed"
	FailLocal  = "local"
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
	DefaultKey        = "{http.vars.client_ip}"
	DefaultIPv4Prefix = 32
	DefaultIPv6Prefix = 64
	// DefaultLease is a concurrency zone's lease when Lease is not set:
	// well above a typical request, so a slow one is renewed rather than
	// lost, and short enough that a crashed instance's slots come back
	// within a minute.
	DefaultLease = time.Minute
	// MaxNameLen bounds a zone name, in bytes: the name travels in the
	// RateLimit-Policy and RateLimit fields of every response (up to three
	// times as long once percent-encoded), and proxies commonly cap a
	// response's header section at 4 or 8 KB.
	MaxNameLen = 256
)

// ValidName reports whether a zone name may be used: any name
// caddy-ratelimit accepts, except the empty name, a name over MaxNameLen
// bytes, invalid UTF-8 (a Prometheus label must be valid), and a character
// that is not graphic (control, format, private-use or unassigned code
// points: invisible or reordering in logs and the admin listing, where they
// could disguise one zone as another). The sinks that cannot carry a name as
// it is encode it (internal/zonename; docs/reference.md, "Zone names").
func ValidName(name string) error {
	switch {
	case name == "":
		return errors.New("name must not be empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("name is longer than %d bytes", MaxNameLen)
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

// SetDefaults fills in the zone's defaults (the ones that Compile does
// not derive: the algorithm, the cost and the lease are resolved there).
func (z *Zone) SetDefaults() {
	if len(z.Key) == 0 {
		z.Key = KeyCandidates{DefaultKey}
	}
	if z.IPv4Prefix == 0 {
		z.IPv4Prefix = DefaultIPv4Prefix
	}
	if z.IPv6Prefix == 0 {
		z.IPv6Prefix = DefaultIPv6Prefix
	}
	if z.Fail == "" {
		z.Fail = FailOpen
	}
}

// IsEnabled reports whether the zone is switched on (Enabled not false).
func (z *Zone) IsEnabled() bool { return z.Enabled == nil || *z.Enabled }

// clientIPHeaders are request headers that carry a client address set by a
// proxy or CDN, and by anyone who reaches Caddy directly.
var clientIPHeaders = []string{"x-forwarded-for", "x-real-ip", "forwarded", "cf-connecting-ip",
	"true-client-ip", "x-client-ip", "fastly-client-ip", "x-cluster-client-ip", "x-original-forwarded-for"}

// spoofableHeader reports whether a placeholder reads one of clientIPHeaders.
func spoofableHeader(ph string) bool {
	name, ok := strings.CutPrefix(strings.ToLower(ph), "http.request.header.")
	return ok && slices.Contains(clientIPHeaders, name)
}

// KeyWarnings explains, once at Provision, keys that limit the wrong
// client or merge clients silently.
func (z *Zone) KeyWarnings() []string {
	var out, unknown []string
	never, sure := false, false // sure: a candidate always present without the peer address
	for _, k := range z.Key {
		c, err := identity.Compile(k)
		if err != nil {
			continue
		}
		if c.NeverEmpty() {
			never = true
			sure = sure || !slices.ContainsFunc(c.Placeholders(), peerAddress)
		}
		for _, ph := range c.Placeholders() {
			switch {
			case unknownPlaceholder(ph):
				unknown = append(unknown, "{"+ph+"}")
			case peerAddress(ph):
				out = append(out, "key uses {"+ph+"}, the TCP peer: behind a proxy or CDN every client shares the proxy's bucket; use {client_ip} with the trusted_proxies server option")
			case spoofableHeader(ph):
				out = append(out, "key uses {"+ph+"}, which any client can set to get a fresh bucket per request; use {client_ip} with the trusted_proxies server option")
			}
		}
	}
	if len(unknown) > 0 {
		bad := strings.Join(unknown, ", ") + " is not a placeholder of Caddy's (always empty): for the client's address use {client_ip} (or {remote_host}, the TCP peer; in JSON {http.vars.client_ip}, {http.request.remote.host})"
		if never {
			out = append(out, "key uses "+bad)
		} else {
			out = append(out, "no key candidate is always present: requests where every candidate is empty share one bucket for the whole zone; "+bad)
		}
	} else if !never {
		out = append(out, "no key candidate is always present (such as {client_ip}): requests where every candidate is empty share one bucket for the whole zone")
	}
	if never && !sure {
		out = append(out, "the only key candidates always present read the peer address ({remote_host}), which Caddy can leave empty on an HTTP/3 0-RTT request: those requests share one bucket; end the key with {client_ip}")
	}
	return out
}
