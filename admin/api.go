// Package admin is the operator's view of the rate_limit zones: the
// admin.api.rate_limit module (Caddy's admin API), the rate_limit_ui
// directive (the live page and its JSON) and the zones' activity counters.
// It reads the zones the handlers register (Register: values and two
// calls), never a handler.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/reply"
	"github.com/sluicehq/caddy-sluice/stores"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

func init() {
	caddy.RegisterModule(API{})
}

// API is the admin.api.rate_limit module: operator endpoints on
// Caddy's admin API, for the zones of the active configuration.
//
//	GET    /rate_limit/zones                            every zone: limit, key, fail policy, store
//	GET    /rate_limit/zones/<zone>                     one zone
//	GET    /rate_limit/zones/<zone>/keys/<key>          a client's state, without charging it
//	DELETE /rate_limit/zones/<zone>/keys/<key>          reset it (unblock the client)
//	GET    /rate_limit/zones/<zone>/tokens/<token>      the same, by the token logs show
//	DELETE /rate_limit/zones/<zone>/tokens/<token>
//	GET    /rate_limit/activity                         decision counters and recent refusals (ui.go)
//	GET, PUT, DELETE /rate_limit/zones/<zone>/overrides[/<key|token>]   overrides.go
//
// The live page is served by a site, not here: the rate_limit_ui directive
// (uihandler.go), which answers the same JSON under its own path.
//
// <key> is the raw key value, URL-escaped: what the zone's key renders for
// the client (an IP address, an API key). It is derived exactly as a
// request's key is (an IP canonicalised and masked, anything else hashed),
// once per key candidate the value could have come from; a read reports
// each, a reset deletes them all. Always loaded, like Caddy's admin.api's.
type API struct{}

// CaddyModule returns the Caddy module information.
func (API) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(API) },
	}
}

// adminPrefix is the admin API path the module serves.
const adminPrefix = "/rate_limit/"

// Routes returns the module's admin API routes.
func (API) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: adminPrefix, Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// ZoneInfo is a zone in the listing.
type ZoneInfo struct {
	Name       string         `json:"name"`
	Algorithm  string         `json:"algorithm"`
	Events     int64          `json:"events"`
	Window     string         `json:"window"`
	WindowMs   int64          `json:"window_ms"`
	Burst      int64          `json:"burst,omitempty"`
	Capacity   int64          `json:"capacity"`
	Cost       any            `json:"cost"`
	Key        []string       `json:"key"`
	IPv4Prefix int            `json:"ipv4_prefix"`
	IPv6Prefix int            `json:"ipv6_prefix"`
	Fail       string         `json:"fail"`
	ReportOnly bool           `json:"report_only"`
	Enabled    bool           `json:"enabled"`
	Store      map[string]any `json:"store"`
	// Count, OnExceed, Penalty, Delay and DelayAfter: the zone's settings,
	// when set.
	Count []string `json:"count,omitempty"`
	// Settle is the zone's settle source ("json usage.total_tokens").
	Settle     string `json:"settle,omitempty"`
	OnExceed   string `json:"on_exceed,omitempty"`
	Penalty    string `json:"penalty,omitempty"`
	Delay      string `json:"delay,omitempty"`
	DelayAfter int64  `json:"delay_after,omitempty"`
	// A concurrency zone's slots and lease (algorithm "concurrency"; its
	// events, window and burst are then 0).
	Concurrent int64  `json:"concurrent,omitempty"`
	Lease      string `json:"lease,omitempty"`
	LeaseMs    int64  `json:"lease_ms,omitempty"`
	// Adaptive: an adaptive concurrency zone's settings and what this
	// instance learnt (the root's adaptive.go); Concurrent is then its current limit.
	Adaptive *Adaptive `json:"adaptive,omitempty"`
	// Sync: a zone in the asynchronous mode, its bound and how this
	// instance's sync runs (the root's sync.go).
	Sync *Sync `json:"sync,omitempty"`
}

// Sync is a zone's asynchronous mode in the listing and the live page.
type Sync struct {
	Interval string `json:"interval"`
	// Bound states how far over the limit a key may go (docs/redis.md).
	Bound   string `json:"bound"`
	Keys    int    `json:"keys"`
	MaxKeys int    `json:"max_keys"`
	// LagMs is the time since the last successful sync started (-1: none
	// yet): the age of the counts this instance decides on.
	LagMs    int64  `json:"lag_ms"`
	Failures int64  `json:"failures"`
	Held     int64  `json:"held"`
	Dropped  int64  `json:"dropped"`
	Error    string `json:"error,omitempty"`
}

// Adaptive is an adaptive zone's part of the admin API's listing and of
// the live page.
type Adaptive struct {
	Controller string  `json:"controller"`
	Minimum    int64   `json:"minimum"`
	Maximum    int64   `json:"maximum"`
	Initial    int64   `json:"initial"`
	Tolerance  float64 `json:"tolerance"`
	Window     string  `json:"window"`
	Delay      string  `json:"delay,omitempty"`
	// Limit, Baseline and Latency are those of the key whose window closed
	// last (the only key of a zone keyed on a constant); InFlight and Keys
	// count every key of this instance.
	Limit      int64   `json:"limit"`
	BaselineMs float64 `json:"baseline_ms"`
	LatencyMs  float64 `json:"latency_ms"`
	InFlight   int64   `json:"in_flight"`
	Keys       int     `json:"keys"`
}

func (az *activeZone) info() ZoneInfo {
	info := az.Info()
	info.Enabled = az.enabled
	info.Store = storeInfo(az.Store)
	return info
}

// storeInfo describes a store for the listing.
func storeInfo(s any) map[string]any {
	if d, ok := s.(stores.Described); ok {
		return d.AdminInfo()
	}
	if m, ok := s.(caddy.Module); ok {
		return map[string]any{"module": m.CaddyModule().ID.Name()}
	}
	return map[string]any{"module": fmt.Sprintf("%T", s)}
}

// State is what a key shows now (see algorithms.Peek).
type State struct {
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// Allowed: a request of cost 1 would pass now (a settle zone's: of
	// the zone's cost, its estimate; the root's settle.go).
	Allowed bool `json:"allowed"`
	// RetryAfter: when a request of cost 1 could pass (0 if it can now);
	// a settle zone's, of the zone's cost.
	RetryAfter   string `json:"retry_after"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	// ResetAfter: when the key is back to full.
	ResetAfter   string `json:"reset_after"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	// InUse: a concurrency zone's slots in use (limit − remaining).
	InUse *int64 `json:"in_use,omitempty"`
	// Debt: a settle zone's units owed beyond its capacity (token_bucket
	// and gcra; the root's settle.go), 0 when none.
	Debt *int64 `json:"debt,omitempty"`
	// InFlight: a settle or count zone's units charged to requests whose
	// response has not settled them yet (the root's inflight.go); the top level's is
	// the sum over the key's tokens.
	InFlight *int64 `json:"in_flight,omitempty"`
}

func stateOf(d algorithms.Decision) State {
	return State{
		Limit:        d.Limit,
		Remaining:    d.Remaining,
		Allowed:      d.Allowed,
		RetryAfter:   d.RetryAfter.String(),
		RetryAfterMs: d.RetryAfter.Milliseconds(),
		ResetAfter:   d.ResetAfter.String(),
		ResetAfterMs: d.ResetAfter.Milliseconds(),
	}
}

// KeyState is one token's state in a peek.
type KeyState struct {
	// Candidate is the key candidate the token derives from, as
	// configured; empty for the zone's shared bucket.
	Candidate string `json:"candidate"`
	Token     string `json:"token"`
	Found     bool   `json:"found"`
	State
}

// Peek answers a read: the most constrained of the tokens that hold
// state (or the fresh state, when none does), and every token.
type Peek struct {
	Zone  string `json:"zone"`
	Found bool   `json:"found"`
	State
	Keys []KeyState `json:"keys"`
	// Overrides: the key's tokens' overrides in force (overrides.go); its
	// limit and remaining above are theirs.
	Overrides []OverrideView `json:"overrides,omitempty"`
}

// Reset answers a reset.
type Reset struct {
	Zone string `json:"zone"`
	// Deleted counts the tokens that held state in the zone's store.
	Deleted int      `json:"deleted"`
	Tokens  []string `json:"tokens"`
	// LocalDeleted counts those held by the fail-local memory store.
	LocalDeleted int `json:"local_deleted,omitempty"`
}

// apiErr builds an admin API error (answered as JSON: {"error": "..."}).
func apiErr(status int, format string, args ...any) error {
	return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf(format, args...)}
}

func methodNotAllowed(w http.ResponseWriter, allowed ...string) error {
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	return apiErr(http.StatusMethodNotAllowed, "method not allowed (allowed: %s)", strings.Join(allowed, ", "))
}

const adminUsage = "expected /rate_limit/zones, /rate_limit/zones/<zone>, /rate_limit/zones/<zone>/keys/<url-escaped key>, /rate_limit/zones/<zone>/tokens/<token> or /rate_limit/zones/<zone>/overrides[/<url-escaped key or token>]"

// serveAdmin routes an admin API request.
func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), adminPrefix)
	if rest == "ui" || rest == "ui.js" {
		return apiErr(http.StatusNotFound, "the live page is served by a site of yours: place the rate_limit_ui directive there, behind its authentication (docs/reference.md)")
	}
	return serveRateLimit(w, r, rest)
}

// serveRateLimit answers a request for the JSON at rest, a path relative
// to /rate_limit/ (escaped): for the admin API and for rate_limit_ui.
func serveRateLimit(w http.ResponseWriter, r *http.Request, rest string) error {
	if rest == "activity" {
		return serveActivity(w, r) // ui.go
	}
	rest, ok := strings.CutPrefix(rest, "zones")
	if !ok {
		return apiErr(http.StatusBadRequest, "malformed path: %s", adminUsage)
	}
	if rest == "" || rest == "/" {
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, http.MethodGet)
		}
		return listZones(w)
	}
	parts := strings.Split(rest[1:], "/")
	overrides := len(parts) >= 2 && len(parts) <= 3 && parts[1] == "overrides"
	if rest[0] != '/' || !(len(parts) == 1 || overrides || len(parts) == 3 && (parts[1] == "keys" || parts[1] == "tokens")) {
		return apiErr(http.StatusBadRequest, "malformed path: %s", adminUsage)
	}
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil || u == "" {
			return apiErr(http.StatusBadRequest, "malformed path: empty or badly escaped segment; %s", adminUsage)
		}
		parts[i] = u
	}
	if len(parts) == 1 {
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, http.MethodGet)
		}
	} else if !overrides && r.Method != http.MethodGet && r.Method != http.MethodDelete {
		return methodNotAllowed(w, http.MethodGet, http.MethodDelete)
	}
	name := parts[0]
	az := activeZones()[name]
	if az == nil {
		if zonemodel.ValidName(name) != nil {
			return apiErr(http.StatusNotFound, "unknown zone (not a valid zone name)")
		}
		return apiErr(http.StatusNotFound, "unknown zone %q: no such zone in the active configuration (GET %szones lists them)", name, adminPrefix)
	}
	if len(parts) == 1 {
		return writeJSON(w, az.info())
	}
	if overrides {
		val := ""
		if len(parts) == 3 {
			val = parts[2]
		}
		return serveOverrides(w, r, az, val) // overrides.go
	}
	toks, cands, err := adminTokens(&az.Zone, parts[1], parts[2])
	if err != nil {
		return err
	}
	if r.Method == http.MethodDelete {
		return resetKey(r.Context(), w, az, toks)
	}
	return peekKey(r.Context(), w, az, toks, cands)
}

// listZones answers GET /rate_limit/zones.
func listZones(w http.ResponseWriter) error {
	zs := activeZones()
	names := make([]string, 0, len(zs))
	for n := range zs {
		names = append(names, n)
	}
	slices.Sort(names)
	out := struct {
		Zones []ZoneInfo `json:"zones"`
	}{Zones: []ZoneInfo{}}
	for _, n := range names {
		out.Zones = append(out.Zones, zs[n].info())
	}
	return writeJSON(w, out)
}

// adminTokens returns the tokens a path's key or token addresses in zone z,
// with the candidate each derives from.
func adminTokens(z *Zone, kind, val string) ([]identity.Token, []string, error) {
	cands := z.Deriver.Candidates()
	if kind == "tokens" {
		tok, ok := identity.ParseToken(val)
		if !ok {
			return nil, nil, apiErr(http.StatusBadRequest, "malformed token %q (a token reads like h1-<32 hex digits>, 41-<8 hex digits>, 61-<32 hex digits> or e0-)", val)
		}
		i := tok.Candidate()
		if i > len(cands) {
			return nil, nil, apiErr(http.StatusBadRequest, "token %s is of key candidate %d, but zone %q has %d", tok, i, z.Name, len(cands))
		}
		cand := ""
		if i > 0 {
			cand = cands[i-1].String()
		}
		return []identity.Token{tok}, []string{cand}, nil
	}
	var toks []identity.Token
	var names []string
	for i, c := range cands {
		if tok, ok := z.Deriver.TokenFor(i, val); ok {
			toks = append(toks, tok)
			names = append(names, c.String())
		}
	}
	if len(toks) == 0 {
		// The value is not echoed: it may be a credential.
		return nil, nil, apiErr(http.StatusBadRequest, "the key value is not one zone %q's key candidates can render (a candidate of several placeholders, or literal text that differs); address the client by the token logs show: %szones/%s/tokens/<token>",
			z.Name, adminPrefix, z.Name)
	}
	return toks, names, nil
}

// storeOf returns the zone's store as a stores.Admin.
func storeOf(az *activeZone) (stores.Admin, error) {
	st, ok := az.Store.(stores.Admin)
	if !ok {
		return nil, apiErr(http.StatusNotImplemented, "zone %q: its store (%T) cannot be read or reset through the admin API", az.Name, az.Store)
	}
	return st, nil
}

// peekKey answers GET .../keys/<key> and .../tokens/<token>.
func peekKey(ctx context.Context, w http.ResponseWriter, az *activeZone, toks []identity.Token, cands []string) error {
	st, err := storeOf(az)
	if err != nil {
		return err
	}
	keys := toks // identity.Token is algorithms.Key
	// The units in flight are read first: none left means their settles
	// have landed, and the state read next shows them.
	inFlight, err := peekInFlight(ctx, az, keys)
	if err != nil {
		return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
	}
	decs := make([]algorithms.Decision, len(keys))
	found := make([]bool, len(keys))
	if err := st.PeekKeys(ctx, az.Name, keys, az.Limit, decs, found); err != nil {
		return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
	}
	out := Peek{Zone: az.Name, Keys: make([]KeyState, len(keys))}
	for i := range keys {
		out.Keys[i] = KeyState{Candidate: cands[i], Token: toks[i].String(), Found: found[i], State: stateOf(decs[i])}
	}
	best := MostConstrained(decs, found)
	out.Found = best >= 0
	if best < 0 {
		best = 0
	}
	out.State = stateOf(decs[best])
	if az.Peek != nil {
		az.Peek(&out)
	}
	if inFlight != nil {
		out.showInFlight(inFlight)
	}
	if ov, ok := az.Store.(stores.Overrider); ok && az.Limit.Algorithm != algorithms.Concurrency {
		es := make([]*stores.OverrideEntry, len(keys))
		if err := ov.PeekOverrides(ctx, az.Name, keys, es); err != nil {
			return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
		}
		for _, e := range es {
			if e != nil {
				out.Overrides = append(out.Overrides, viewOf(e))
			}
		}
	}
	return writeJSON(w, out)
}

// inFlightPeeker reads keys' units charged in flight (memstore, redisstore).
type inFlightPeeker interface {
	PeekInFlight(ctx context.Context, zone string, keys []algorithms.Key, l algorithms.Limit, out []int64) error
}

// peekInFlight reads each key's units charged in flight, for a zone whose
// charges stay in flight until the response (its planned request's
// InFlight: count, settle); nil for another zone.
func peekInFlight(ctx context.Context, az *activeZone, keys []identity.Token) ([]int64, error) {
	ip, ok := az.Store.(inFlightPeeker)
	if !ok || !az.InFlight {
		return nil, nil
	}
	n := make([]int64, len(keys))
	if err := ip.PeekInFlight(ctx, az.Name, keys, az.Limit, n); err != nil {
		return nil, err
	}
	return n, nil
}

// showInFlight adds each key's units charged in flight to the peek.
func (p *Peek) showInFlight(n []int64) {
	var sum int64
	for i := range p.Keys {
		p.Keys[i].InFlight, sum = &n[i], sum+n[i]
	}
	p.InFlight = &sum
}

// MostConstrained returns the index of the most constrained of the peeked
// decisions that found state (reply.Standing; a decision not Allowed is a
// refusal), -1 if none did.
func MostConstrained(decs []algorithms.Decision, found []bool) int {
	best := -1
	for i := range decs {
		if found[i] && (best < 0 || peekStanding(&decs[i]).Tighter(peekStanding(&decs[best]))) {
			best = i
		}
	}
	return best
}

func peekStanding(d *algorithms.Decision) reply.Standing {
	return reply.Standing{Refused: !d.Allowed, Retry: int64(d.RetryAfter), Remaining: d.Remaining, Reset: int64(d.ResetAfter)}
}

// resetKey answers DELETE .../keys/<key> and .../tokens/<token>: every
// token is deleted from the zone's store and, for a zone that fails to a
// local memory store, from that one too (so a client unblocked during an
// outage is unblocked there as well).
func resetKey(ctx context.Context, w http.ResponseWriter, az *activeZone, toks []identity.Token) error {
	st, err := storeOf(az)
	if err != nil {
		return err
	}
	keys := make([]algorithms.Key, len(toks))
	out := Reset{Zone: az.Name, Tokens: make([]string, len(toks))}
	for i, t := range toks {
		keys[i] = t
		out.Tokens[i] = t.String()
	}
	n, err := st.ResetKeys(ctx, az.Name, keys)
	if err != nil {
		return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
	}
	out.Deleted = n
	if local, ok := az.Local.(stores.Admin); ok && az.Local != az.Store {
		if n, err := local.ResetKeys(ctx, az.Name, keys); err == nil {
			out.LocalDeleted = n
		}
	}
	return writeJSON(w, out)
}

func writeJSON(w http.ResponseWriter, v any) error {
	return writeJSONStatus(w, http.StatusOK, v)
}

func writeJSONStatus(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return errors.New("encoding the answer: " + err.Error())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

// Interface guards.
var _ caddy.AdminRouter = API{}
