package sluice

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/memstore"
	"github.com/sluicehq/caddy-sluice/reply"
	"github.com/sluicehq/caddy-sluice/telemetry"
	"github.com/sluicehq/caddy-sluice/zoneapp"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is the rate_limit HTTP handler. Each request is checked against
// every zone whose matchers it matches, all in one atomic call to the store:
// if every zone allows, every zone is charged and the request goes on;
// otherwise nothing is charged and the request is refused with a 429 (or
// handed to the site's handle_errors routes). docs/reference.md documents
// every field; JSON names follow mholt/caddy-ratelimit's where the concept
// is the same.
type Handler struct {
	// RateLimits are the zones, by name: up to 256 bytes of UTF-8 text
	// without control or format characters. A name is global across the
	// configuration: one name in two places is one bucket, and must carry
	// one limit and one store. Required.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// StoreRaw is the state store, a module in the
	// http.handlers.rate_limit.stores namespace. Default: "memory", shared
	// by handlers with the same store configuration and kept across
	// reloads.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=http.handlers.rate_limit.stores inline_key=module"`

	// Headers selects the rate limit headers on every decided response:
	// "legacy" (X-RateLimit-*), "draft" (RateLimit-Policy and RateLimit,
	// draft-ietf-httpapi-ratelimit-headers-11), "both" or "off".
	// Default: "legacy".
	Headers string `json:"headers,omitempty"`

	// Response shapes the refusal. Default: 429 with a small JSON body.
	Response *Response `json:"response,omitempty"`

	// Jitter adds up to this fraction of random time to Retry-After (0.2:
	// up to 20%), a finite number of at least 0. Default: 0.
	Jitter float64 `json:"jitter,omitempty"`

	// LogKey adds the raw key to refusal log lines, which otherwise carry
	// only its token.
	LogKey bool `json:"log_key,omitempty"`

	// ReportOnly puts every zone in report-only mode (see Zone.ReportOnly).
	ReportOnly bool `json:"report_only,omitempty"`

	// Enabled false makes the handler a pass-through (no decisions, no
	// headers). Default: true.
	Enabled *bool `json:"enabled,omitempty"`

	// SweepInterval is caddy-ratelimit's name for how often the default
	// memory store drops full keys; at least 1s, and not with StoreRaw.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// Distributed is caddy-ratelimit's distributed block: every zone in
	// the asynchronous mode (Zone.Sync), which needs store redis
	// (distributed.go, docs/migrating.md). Default: none.
	Distributed *Distributed `json:"distributed,omitempty"`

	// StorageRaw is caddy-ratelimit's storage for Distributed: refused
	// likewise.
	StorageRaw json.RawMessage `json:"storage,omitempty"`

	// MaxWaiting bounds the requests of this handler waiting at once for
	// their turn (zones with delay); past it, a request that would wait is
	// decided as if it could not: refused. At least 1. Default: 1000.
	MaxWaiting int `json:"max_waiting,omitempty"`

	// SettleWait bounds how long a request refused only because of its
	// keys' charges in flight (zones with count or settle, still waiting
	// for their responses) waits for them to settle before it is refused;
	// it has a seat in the waiting room (max_waiting) meanwhile. 0: no
	// waiting. At most 1m. Default: 1s. Without such a zone it does nothing
	// (warned about at load).
	SettleWait *caddy.Duration `json:"settle_wait,omitempty"`

	// GRPCStatus is the status of a refused gRPC call (a request with
	// Content-Type application/grpc or application/grpc-web):
	// "resource_exhausted" (code 8) or "unavailable" (code 14, which
	// clients retry at once unless the pushback says otherwise). A
	// fail-closed refusal is always "unavailable". docs/protocols.md has
	// the answer's shape. Default: "resource_exhausted".
	GRPCStatus string `json:"grpc_status,omitempty"`

	zones []*zone
	// planned are the zones' requests as far as Provision knows them (the
	// controls set their fields); a request's plan fills in the rest.
	planned []algorithms.Request
	// on lists, per stage, the controls that joined it (controls.go).
	on          [numStages][]*control
	decider     decider // the decide stage's layers (failpolicy.go)
	store       Store
	local       Store
	storeStats  *telemetry.StoreMetrics
	storeErrors *telemetry.SampledLog
	refusalLog  *telemetry.SampledLog
	legacy      bool
	draft       bool
	enabled     bool
	resp        reply.Shape
	app         *App // the configuration's: zone names are checked across it
	events      *caddyevents.App
	logger      *zap.Logger
	ctx         caddy.Context
	// The controls' state of the directive, one slot each:
	// requestjson.go's, pass.go's.
	requestJSON requestJSONDirective
	passing     passDirective
	// room counts the requests waiting (delay, charges in flight, an
	// adaptive place), at most max_waiting (admission.go).
	room *waitingRoom
	// inflight is the wait for charges in flight (inflight.go).
	inflight *chargesWait
	// pin: the store, when it is one a reload keeps open while requests
	// pin it (storePinner) and this directive's requests may call it after
	// their decision (a planned charge given back or settled,
	// provisionIn); nil otherwise.
	pin      storePinner
	releases []func() // the local allowances' registrations (provisionAllowances)
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Header modes.
const (
	headersLegacy = "legacy"
	headersDraft  = "draft"
	headersBoth   = "both"
	headersOff    = "off"
)

// Provision sets defaults, compiles the zones, loads the store and registers
// the zone names for the config-wide consistency check.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger = ctx.Logger()
	h.storeErrors = telemetry.NewSampledLog(1, telemetry.StoreErrorInterval)
	h.refusalLog = telemetry.NewSampledLog(telemetry.RefusalLines, time.Second)
	if h.Headers == "" {
		h.Headers = headersLegacy
	}
	if err := h.Validate(); err != nil {
		return err
	}
	h.legacy = h.Headers == headersLegacy || h.Headers == headersBoth
	h.draft = h.Headers == headersDraft || h.Headers == headersBoth
	h.enabled = h.Enabled == nil || *h.Enabled

	if err := h.checkDistributed(h.StoreRaw); err != nil {
		return err
	}
	h.applyDistributed()
	if h.StoreRaw == nil {
		// (LoadModule clears StoreRaw once loaded, so Validate, which Caddy
		// calls after Provision, does not see sweep_interval beside a store.)
		mem := &memstore.Memory{SweepInterval: h.SweepInterval}
		h.StoreRaw = caddyconfig.JSONModuleObject(mem, "module", "memory", nil)
	}
	mod, err := ctx.LoadModule(h, "StoreRaw")
	if err != nil {
		return fmt.Errorf("loading store: %w", err)
	}
	st, ok := mod.(Store)
	if !ok {
		return fmt.Errorf("store module %T does not implement the rate limit store contract", mod)
	}
	h.store = st

	if err := h.provisionZones(ctx); err != nil {
		return err
	}
	if err := h.provisionAllowances(); err != nil {
		return err
	}

	if !h.DisableMetrics {
		if err := telemetry.Register(ctx.GetMetricsRegistry()); err != nil {
			return fmt.Errorf("registering metrics: %w", err)
		}
		for _, z := range h.zones {
			z.metrics = telemetry.NewZoneMetrics(z.name, perRequestFields(z))
		}
		name := "custom"
		if m, ok := h.store.(caddy.Module); ok {
			name = m.CaddyModule().ID.Name()
		}
		h.storeStats = telemetry.NewStoreMetrics(name)
	}
	h.planned = plannedOf(h.zones)
	h.room = newWaitingRoom(h.MaxWaiting)
	if err := h.provisionControls(); err != nil {
		return err
	}
	h.resp = h.Response.Compile(reply.Settings{Legacy: h.legacy, Jitter: h.Jitter, GRPCStatus: h.GRPCStatus})
	h.decider = h.decideStage()

	ev, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("loading events app: %w", err)
	}
	h.events = ev.(*caddyevents.App)

	// Zone names are checked across the whole configuration being loaded.
	app, err := zoneapp.Of(ctx)
	if err != nil {
		return err
	}
	if err := app.Register(zoneUses(h), storeKey(h.store)); err != nil {
		return err
	}
	h.app = app
	adminRegister(h) // for admin.api.rate_limit (admin.go)
	return nil
}

// plannedOf returns the zones' requests as far as their configuration
// says; the controls set their fields at Provision.
func plannedOf(zones []*zone) []algorithms.Request {
	planned := make([]algorithms.Request, len(zones))
	for i, z := range zones {
		planned[i] = algorithms.Request{Zone: z.name, Limit: z.limit, ReportOnly: z.reportOnly}
	}
	return planned
}

// provisionZones compiles the zones, in the order of their names, loads
// their matchers, and loads the memory store of fail-local zones.
func (h *Handler) provisionZones(ctx caddy.Context) error {
	names := slices.Sorted(maps.Keys(h.RateLimits))
	for _, name := range names {
		cfg := h.RateLimits[name]
		if cfg == nil {
			return zoneErr(name, errors.New("empty configuration"))
		}
		cfg.SetDefaults()
		if h.ReportOnly {
			cfg.ReportOnly = true
		}
		z, err := compileZone(cfg, name)
		if err != nil {
			return zoneErr(name, err)
		}
		if cfg.MatcherSetsRaw != nil {
			mods, err := ctx.LoadModule(cfg, "MatcherSetsRaw")
			if err == nil {
				err = z.matchers.FromInterface(mods)
			}
			if err != nil {
				return zoneErr(name, fmt.Errorf("match: %w", err))
			}
		}
		if cfg.Enabled != nil && !*cfg.Enabled {
			h.logger.Info("rate limit zone switched off (enabled false)", zap.String("zone", name))
			continue
		}
		for _, w := range cfg.KeyWarnings() {
			h.logger.Warn(w, zap.String("zone", name))
		}
		if z.fail == failLocalPolicy && h.local == nil {
			// The fail-local fallback: this instance's default memory store.
			mod, err := ctx.LoadModuleByID("http.handlers.rate_limit.stores.memory", json.RawMessage(`{}`))
			if err != nil {
				return zoneErr(name, fmt.Errorf("fail local: loading the memory store: %w", err))
			}
			h.local = mod.(Store)
		}
		for _, o := range h.zones {
			if o.deriver.Same(z.deriver) {
				z.deriver = o.deriver // one derivation per request for both (plan)
				break
			}
		}
		h.zones = append(h.zones, z)
	}
	return nil
}

// checkCompat refuses caddy-ratelimit settings that have no meaning here,
// naming the Sluice equivalent, and checks distributed's values.
func (h *Handler) checkCompat() error {
	if err := h.Distributed.validate(); err != nil {
		return err
	}
	if h.StorageRaw != nil {
		return errors.New("storage: Sluice keeps rate limit state in its own store; use `store memory` (the default) or a shared store (store redis { url ... }) instead")
	}
	return nil
}

// Validate checks the handler's configuration; Provision calls it first,
// before it loads anything.
func (h *Handler) Validate() error {
	if err := h.checkCompat(); err != nil {
		return err
	}
	if len(h.RateLimits) == 0 {
		return errors.New("at least one zone is required")
	}
	switch h.Headers {
	case "", headersLegacy, headersDraft, headersBoth, headersOff:
	default:
		return fmt.Errorf("headers: unknown mode %q (known: legacy, draft, both, off)", h.Headers)
	}
	if math.IsNaN(h.Jitter) || math.IsInf(h.Jitter, 0) || h.Jitter < 0 {
		return fmt.Errorf("jitter must be a fraction of at least 0 (0.2 adds up to 20%% to Retry-After), got %v", h.Jitter)
	}
	if h.SweepInterval != 0 {
		if h.StoreRaw != nil {
			return errors.New("sweep_interval configures the default memory store, but this handler's store is set (by `store` or by the global rate_limit option): set it in the store instead (store memory { sweep_interval ... })")
		}
		if time.Duration(h.SweepInterval) < memstore.MinSweepInterval {
			return fmt.Errorf("sweep_interval must be at least %s, got %s", memstore.MinSweepInterval, time.Duration(h.SweepInterval))
		}
	}
	if err := h.validateZoneModes(); err != nil {
		return err
	}
	if h.MaxWaiting < 0 {
		return fmt.Errorf("max_waiting must be at least 1, got %d", h.MaxWaiting)
	}
	if _, err := settleWaitOf(h.SettleWait); err != nil {
		return err
	}
	if err := reply.CheckGRPCStatus(h.GRPCStatus); err != nil {
		return err
	}
	return h.Response.Validate()
}

// provisionAllowances gives the store the zones with a local allowance.
func (h *Handler) provisionAllowances() error {
	for _, z := range h.zones {
		if z.allowance == nil {
			continue
		}
		as, ok := h.store.(allowanceStore)
		if !ok {
			return zoneErr(z.name, errors.New("local_allowance needs a shared store that draws batches (store redis); the memory store decides every request locally already"))
		}
		release, err := as.LocalAllowance(z.name, z.limit, z.allowance.MaxBatch, time.Duration(z.allowance.Expiry))
		if err != nil {
			return zoneErr(z.name, err)
		}
		h.releases = append(h.releases, release)
	}
	return nil
}

// Cleanup releases the zone names registered by Provision.
func (h *Handler) Cleanup() error {
	h.cleanupControls()
	for _, release := range h.releases {
		release()
	}
	h.releases = nil
	adminUnregister(h)
	if h.app != nil {
		h.app.Unregister(zoneUses(h))
		h.app = nil
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
