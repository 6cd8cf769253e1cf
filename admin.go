package sluice

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/reply"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI is the admin.api.rate_limit module: operator endpoints on
// Caddy's admin API, for the zones of the active configuration.
//
//	GET    /rate_limit/zones                            every zone: limit, key, fail policy, store
//	GET    /rate_limit/zones/<zone>                     one zone
//	GET    /rate_limit/zones/<zone>/keys/<key>          a client's state, without charging it
//	DELETE /rate_limit/zones/<zone>/keys/<key>          reset it (unblock the client)
//	GET    /rate_limit/zones/<zone>/tokens/<token>      the same, by the token logs show
//	DELETE /rate_limit/zones/<zone>/tokens/<token>
//	GET    /rate_limit/activity                         decision counters and recent refusals (ui.go)
//
// The live page is served by a site, not here: the rate_limit_ui directive
// (uihandler.go), which answers the same JSON under its own path.
//
// <key> is the raw key value, URL-escaped: what the zone's key renders for
// the client (an IP address, an API key). It is derived exactly as a
// request's key is (an IP canonicalised and masked, anything else hashed),
// once per key candidate the value could have come from; a read reports
// each, a reset deletes them all. Like Caddy's other admin.api modules, it
// is always loaded.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// adminPrefix is the admin API path the module serves.
const adminPrefix = "/rate_limit/"

// Routes returns the module's admin API routes.
func (AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: adminPrefix, Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// The admin registry: every provisioned handler, by configuration. The
// active configuration is the one provisioned last whose handlers are still
// registered: a configuration being loaded replaces the running one in the
// listing as soon as it is provisioned; if it fails to load, its handlers'
// Cleanup removes it and the running one shows again; once it runs, the old
// one's Cleanup removes the old handlers.
var adminRegistry = struct {
	sync.Mutex
	next     uint64
	gens     map[*App]uint64 // configuration → generation
	handlers map[*Handler]adminEntry
}{gens: map[*App]uint64{}, handlers: map[*Handler]adminEntry{}}

type adminEntry struct {
	app   *App   // the configuration's
	gen   uint64 // the configuration's generation
	order uint64 // the handler's, within it
}

// adminRegister records a provisioned handler (h.app set) for the admin
// API.
func adminRegister(h *Handler) {
	r := &adminRegistry
	r.Lock()
	defer r.Unlock()
	r.next++
	gen, ok := r.gens[h.app]
	if !ok {
		gen = r.next
		r.gens[h.app] = gen
	}
	r.handlers[h] = adminEntry{app: h.app, gen: gen, order: r.next}
}

// adminUnregister forgets a handler (a no-op if it was never registered).
func adminUnregister(h *Handler) {
	r := &adminRegistry
	r.Lock()
	defer r.Unlock()
	e, ok := r.handlers[h]
	if !ok {
		return
	}
	delete(r.handlers, h)
	for _, o := range r.handlers {
		if o.app == e.app {
			return
		}
	}
	delete(r.gens, e.app)
}

// activeHandlers returns the handlers of the active configuration, in the
// order they were provisioned.
func activeHandlers() []*Handler {
	r := &adminRegistry
	r.Lock()
	defer r.Unlock()
	var gen uint64
	for _, e := range r.handlers {
		gen = max(gen, e.gen)
	}
	var hs []*Handler
	for h, e := range r.handlers {
		if e.gen == gen {
			hs = append(hs, h)
		}
	}
	slices.SortFunc(hs, func(a, b *Handler) int {
		return cmp.Compare(r.handlers[a].order, r.handlers[b].order)
	})
	return hs
}

// adminZone is one zone of the active configuration: its compiled form and
// the first handler that uses it (every use shares the limit and the store:
// see App.register).
type adminZone struct {
	z       *zone
	h       *Handler
	enabled bool // some handler using it is enabled
}

// activeZones returns the zones of the active configuration by name.
func activeZones() map[string]*adminZone {
	out := map[string]*adminZone{}
	for _, h := range activeHandlers() {
		for _, z := range h.zones {
			az := out[z.name]
			if az == nil {
				az = &adminZone{z: z, h: h}
				out[z.name] = az
			}
			az.enabled = az.enabled || h.enabled
		}
	}
	return out
}

// adminZoneInfo is a zone in the listing.
type adminZoneInfo struct {
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
	// instance learnt (adaptive.go); Concurrent is then its current limit.
	Adaptive *adminAdaptive `json:"adaptive,omitempty"`
}

func (az *adminZone) info() adminZoneInfo {
	z := az.z
	var keys []string
	for _, c := range z.deriver.Candidates() {
		keys = append(keys, c.String())
	}
	v4, v6 := z.deriver.Prefixes()
	var cost any = z.cost
	if z.costExpr != nil {
		cost = z.costExpr.String()
	}
	info := adminZoneInfo{
		Name:       z.name,
		Algorithm:  z.limit.Algorithm.String(),
		Events:     z.limit.Events,
		Window:     (time.Duration(z.limit.Window) * time.Millisecond).String(),
		WindowMs:   z.limit.Window,
		Burst:      z.limit.Burst,
		Capacity:   z.limit.Capacity(),
		Cost:       cost,
		Key:        keys,
		IPv4Prefix: v4,
		IPv6Prefix: v6,
		Fail:       z.fail,
		ReportOnly: z.reportOnly,
		Enabled:    az.enabled,
		Store:      storeInfo(az.h.store),
	}
	return adminControls(z, info)
}

// storeInfo describes a store for the listing.
func storeInfo(s Store) map[string]any {
	if d, ok := s.(describedStore); ok {
		return d.AdminInfo()
	}
	if m, ok := s.(caddy.Module); ok {
		return map[string]any{"module": m.CaddyModule().ID.Name()}
	}
	return map[string]any{"module": fmt.Sprintf("%T", s)}
}

// adminState is what a key shows now (see algorithms.Peek).
type adminState struct {
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// Allowed: a request of cost 1 would pass now (a settle zone's: of
	// the zone's cost, its estimate; settle.go).
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
	// and gcra; settle.go), 0 when none.
	Debt *int64 `json:"debt,omitempty"`
	// InFlight: a settle or count zone's units charged to requests whose
	// response has not settled them yet (inflight.go); the top level's is
	// the sum over the key's tokens.
	InFlight *int64 `json:"in_flight,omitempty"`
}

func stateOf(d algorithms.Decision) adminState {
	return adminState{
		Limit:        d.Limit,
		Remaining:    d.Remaining,
		Allowed:      d.Allowed,
		RetryAfter:   d.RetryAfter.String(),
		RetryAfterMs: d.RetryAfter.Milliseconds(),
		ResetAfter:   d.ResetAfter.String(),
		ResetAfterMs: d.ResetAfter.Milliseconds(),
	}
}

// adminKeyState is one token's state in a peek.
type adminKeyState struct {
	// Candidate is the key candidate the token derives from, as
	// configured; empty for the zone's shared bucket.
	Candidate string `json:"candidate"`
	Token     string `json:"token"`
	Found     bool   `json:"found"`
	adminState
}

// adminPeek answers a read: the most constrained of the tokens that hold
// state (or the fresh state, when none does), and every token.
type adminPeek struct {
	Zone  string `json:"zone"`
	Found bool   `json:"found"`
	adminState
	Keys []adminKeyState `json:"keys"`
}

// adminReset answers a reset.
type adminReset struct {
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

const adminUsage = "expected /rate_limit/zones, /rate_limit/zones/<zone>, /rate_limit/zones/<zone>/keys/<url-escaped key> or /rate_limit/zones/<zone>/tokens/<token>"

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
	if rest[0] != '/' || !(len(parts) == 1 || len(parts) == 3 && (parts[1] == "keys" || parts[1] == "tokens")) {
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
	} else if r.Method != http.MethodGet && r.Method != http.MethodDelete {
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
	toks, cands, err := adminTokens(az.z, parts[1], parts[2])
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
		Zones []adminZoneInfo `json:"zones"`
	}{Zones: []adminZoneInfo{}}
	for _, n := range names {
		out.Zones = append(out.Zones, zs[n].info())
	}
	return writeJSON(w, out)
}

// adminTokens returns the tokens a path's key or token addresses in zone z,
// with the candidate each derives from.
func adminTokens(z *zone, kind, val string) ([]identity.Token, []string, error) {
	cands := z.deriver.Candidates()
	if kind == "tokens" {
		tok, ok := identity.ParseToken(val)
		if !ok {
			return nil, nil, apiErr(http.StatusBadRequest, "malformed token %q (a token reads like h1-<32 hex digits>, 41-<8 hex digits>, 61-<32 hex digits> or e0-)", val)
		}
		i := tok.Candidate()
		if i > len(cands) {
			return nil, nil, apiErr(http.StatusBadRequest, "token %s is of key candidate %d, but zone %q has %d", tok, i, z.name, len(cands))
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
		if tok, ok := z.deriver.TokenFor(i, val); ok {
			toks = append(toks, tok)
			names = append(names, c.String())
		}
	}
	if len(toks) == 0 {
		// The value is not echoed: it may be a credential.
		return nil, nil, apiErr(http.StatusBadRequest, "the key value is not one zone %q's key candidates can render (a candidate of several placeholders, or literal text that differs); address the client by the token logs show: %szones/%s/tokens/<token>",
			z.name, adminPrefix, z.name)
	}
	return toks, names, nil
}

// storeOf returns the zone's store as an adminStore.
func storeOf(az *adminZone) (adminStore, error) {
	st, ok := az.h.store.(adminStore)
	if !ok {
		return nil, apiErr(http.StatusNotImplemented, "zone %q: its store (%T) cannot be read or reset through the admin API", az.z.name, az.h.store)
	}
	return st, nil
}

// peekKey answers GET .../keys/<key> and .../tokens/<token>.
func peekKey(ctx context.Context, w http.ResponseWriter, az *adminZone, toks []identity.Token, cands []string) error {
	st, err := storeOf(az)
	if err != nil {
		return err
	}
	keys := toks // identity.Token is algorithms.Key
	// The units in flight are read first: none left means their settles
	// have landed, and the state read next shows them.
	inFlight, err := peekInFlight(ctx, az, keys)
	if err != nil {
		return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.z.name, err)
	}
	decs := make([]algorithms.Decision, len(keys))
	found := make([]bool, len(keys))
	if err := st.PeekKeys(ctx, az.z.name, keys, az.z.limit, decs, found); err != nil {
		return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.z.name, err)
	}
	out := adminPeek{Zone: az.z.name, Keys: make([]adminKeyState, len(keys))}
	for i := range keys {
		out.Keys[i] = adminKeyState{Candidate: cands[i], Token: toks[i].String(), Found: found[i], adminState: stateOf(decs[i])}
	}
	best := mostConstrained(decs, found)
	out.Found = best >= 0
	if best < 0 {
		best = 0
	}
	out.adminState = stateOf(decs[best])
	if az.z.conc != nil {
		out.showInUse()
	}
	if az.z.settle != nil {
		out.showDebt(az.z.limit, az.z.cost)
	}
	if inFlight != nil {
		out.showInFlight(inFlight)
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
func peekInFlight(ctx context.Context, az *adminZone, keys []identity.Token) ([]int64, error) {
	ip, ok := az.h.store.(inFlightPeeker)
	if i := slices.Index(az.h.zones, az.z); !ok || i < 0 || !az.h.planned[i].InFlight {
		return nil, nil
	}
	n := make([]int64, len(keys))
	if err := ip.PeekInFlight(ctx, az.z.name, keys, az.z.limit, n); err != nil {
		return nil, err
	}
	return n, nil
}

// showInFlight adds each key's units charged in flight to the peek.
func (p *adminPeek) showInFlight(n []int64) {
	var sum int64
	for i := range p.Keys {
		p.Keys[i].InFlight, sum = &n[i], sum+n[i]
	}
	p.InFlight = &sum
}

// mostConstrained returns the index of the most constrained of the peeked
// decisions that found state (reply.Standing; a decision not Allowed is a
// refusal), -1 if none did.
func mostConstrained(decs []algorithms.Decision, found []bool) int {
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
func resetKey(ctx context.Context, w http.ResponseWriter, az *adminZone, toks []identity.Token) error {
	st, err := storeOf(az)
	if err != nil {
		return err
	}
	keys := make([]algorithms.Key, len(toks))
	out := adminReset{Zone: az.z.name, Tokens: make([]string, len(toks))}
	for i, t := range toks {
		keys[i] = t
		out.Tokens[i] = t.String()
	}
	n, err := st.ResetKeys(ctx, az.z.name, keys)
	if err != nil {
		return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.z.name, err)
	}
	out.Deleted = n
	if local, ok := az.h.local.(adminStore); ok && az.h.local != az.h.store {
		if n, err := local.ResetKeys(ctx, az.z.name, keys); err == nil {
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
var _ caddy.AdminRouter = AdminAPI{}
