package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/stores"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// Overrides through the admin API and the live page:
//
//	GET    /rate_limit/zones/<zone>/overrides               the zone's overrides in force
//	PUT    /rate_limit/zones/<zone>/overrides/<key|token>   set one (JSON body: OverrideBody)
//	GET    /rate_limit/zones/<zone>/overrides/<key|token>   the key's
//	DELETE /rate_limit/zones/<zone>/overrides/<key|token>   remove it
//
// A value that reads as a token (Token.String) is a token; any other is a
// raw key, addressing each token its candidates derive (like a reset).
// Each set, delete and expiry is logged (the audit) and the zone's count
// in force reported (Zone.OverridesInForce).

// Bounds of an override's expiry.
const (
	// DefaultOverrideTTL is an override's life when its body names none.
	DefaultOverrideTTL = time.Hour
	// MaxOverrideTTL is the longest an override may live.
	MaxOverrideTTL = 30 * 24 * time.Hour
	// maxOverrideBody bounds a PUT's body.
	maxOverrideBody = 4096
	// overrideSweep is how often the expired overrides are collected
	// (logged, uncounted).
	overrideSweep = 5 * time.Second
)

// OverrideBody is a PUT's body: a limit (events and window, burst
// optional), or block, or unlimited; an expiry (expires_in, a duration, or
// expires, RFC 3339; default 1h, at most 30 days); a reason.
type OverrideBody struct {
	Events    int64  `json:"events,omitempty"`
	Window    string `json:"window,omitempty"`
	Burst     int64  `json:"burst,omitempty"`
	Block     bool   `json:"block,omitempty"`
	Unlimited bool   `json:"unlimited,omitempty"`
	ExpiresIn string `json:"expires_in,omitempty"`
	Expires   string `json:"expires,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

// OverrideView is an override as the API shows it.
type OverrideView struct {
	Token     string `json:"token"`
	Kind      string `json:"kind"` // limit, block, unlimited
	Events    int64  `json:"events,omitempty"`
	Window    string `json:"window,omitempty"`
	WindowMs  int64  `json:"window_ms,omitempty"`
	Burst     int64  `json:"burst,omitempty"`
	Capacity  int64  `json:"capacity"`
	Expires   string `json:"expires"`
	ExpiresMs int64  `json:"expires_ms"`
	Reason    string `json:"reason"`
	By        string `json:"by"`
	At        string `json:"at"`
}

func viewOf(e *stores.OverrideEntry) OverrideView {
	v := OverrideView{Token: e.Key.String(), Kind: "limit", Expires: msTime(e.Expires), ExpiresMs: e.Expires,
		Reason: e.Reason, By: e.By, At: msTime(e.At)}
	switch {
	case e.Block:
		v.Kind = "block"
	case e.Unlimited:
		v.Kind = "unlimited"
	default:
		v.Events, v.WindowMs, v.Burst, v.Capacity = e.Events, e.Window, e.Burst, e.Capacity()
		v.Window = (time.Duration(e.Window) * time.Millisecond).String()
	}
	return v
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }

// OverrideList answers a zone's listing.
type OverrideList struct {
	Zone      string         `json:"zone"`
	Max       int            `json:"max_overrides"`
	Overrides []OverrideView `json:"overrides"`
}

// overrideLog is the audit's logger.
func overrideLog() *zap.Logger { return caddy.Log().Named("rate_limit.overrides") }

// overriderOf returns the zone's store as a stores.Overrider.
func overriderOf(az *activeZone) (stores.Overrider, error) {
	if az.Limit.Algorithm == algorithms.Concurrency {
		return nil, apiErr(http.StatusBadRequest, "zone %q: %v", az.Name, algorithms.ErrOverrideConc)
	}
	if az.Sync {
		return nil, apiErr(http.StatusBadRequest, "zone %q decides asynchronously (sync): overrides apply to exact zones only; keep the zone exact to override its keys", az.Name)
	}
	o, ok := az.Store.(stores.Overrider)
	if !ok {
		return nil, apiErr(http.StatusNotImplemented, "zone %q: its store (%T) keeps no overrides", az.Name, az.Store)
	}
	return o, nil
}

// maxOverrides is the zone's bound.
func (z *Zone) maxOverrides() int {
	if z.MaxOverrides > 0 {
		return z.MaxOverrides
	}
	return zonemodel.DefaultMaxOverrides
}

// serveOverrides answers .../overrides and .../overrides/<key|token>
// (val; "" for the listing).
func serveOverrides(w http.ResponseWriter, r *http.Request, az *activeZone, val string) error {
	st, err := overriderOf(az)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if val == "" {
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, http.MethodGet)
		}
		live, err := collect(ctx, az, st)
		if err != nil {
			return err
		}
		out := OverrideList{Zone: az.Name, Max: az.maxOverrides(), Overrides: []OverrideView{}}
		for i := range live {
			out.Overrides = append(out.Overrides, viewOf(&live[i]))
		}
		slices.SortFunc(out.Overrides, func(a, b OverrideView) int { return strings.Compare(a.Token, b.Token) })
		return writeJSON(w, out)
	}
	kind := "keys"
	if _, ok := identity.ParseToken(val); ok {
		kind = "tokens"
	}
	toks, _, err := adminTokens(&az.Zone, kind, val)
	if err != nil {
		return err
	}
	switch r.Method {
	case http.MethodPut:
		return putOverride(w, r, az, st, toks)
	case http.MethodDelete:
		return deleteOverride(w, r, az, st, toks)
	case http.MethodGet:
		out := make([]*stores.OverrideEntry, len(toks))
		if err := st.PeekOverrides(ctx, az.Name, toks, out); err != nil {
			return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
		}
		list := OverrideList{Zone: az.Name, Max: az.maxOverrides(), Overrides: []OverrideView{}}
		for _, e := range out {
			if e != nil {
				list.Overrides = append(list.Overrides, viewOf(e))
			}
		}
		return writeJSON(w, list)
	}
	return methodNotAllowed(w, http.MethodGet, http.MethodPut, http.MethodDelete)
}

// collect lists the zone's overrides in force, logs those that ended and
// reports the count in force.
func collect(ctx context.Context, az *activeZone, st stores.Overrider) ([]stores.OverrideEntry, error) {
	live, expired, err := st.Overrides(ctx, az.Name)
	for i := range expired {
		logOverride("override expired", az.Name, &expired[i], "")
	}
	if err != nil {
		return nil, apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
	}
	if az.OverridesInForce != nil {
		az.OverridesInForce(len(live))
	}
	return live, nil
}

// parseOverride reads a PUT's body into an override checked against the
// zone's limit; its errors name the field.
func parseOverride(r *http.Request, l algorithms.Limit, now time.Time) (algorithms.Override, string, error) {
	var o algorithms.Override
	body, err := io.ReadAll(io.LimitReader(r.Body, maxOverrideBody+1))
	if err != nil {
		return o, "", apiErr(http.StatusBadRequest, "reading the body: %v", err)
	}
	if len(body) > maxOverrideBody {
		return o, "", apiErr(http.StatusRequestEntityTooLarge, "the body exceeds %d bytes", maxOverrideBody)
	}
	var b OverrideBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te):
			want := "a string"
			switch te.Type.Kind() {
			case reflect.Int64:
				want = "a whole number"
			case reflect.Bool:
				want = "true or false"
			}
			return o, "", apiErr(http.StatusBadRequest, "field %s: want %s, got a JSON %s", te.Field, want, te.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return o, "", apiErr(http.StatusBadRequest, "%s (known: events, window, burst, block, unlimited, expires_in, expires, reason)", strings.TrimPrefix(err.Error(), "json: "))
		}
		return o, "", apiErr(http.StatusBadRequest, "the body is not a JSON object: %v", err)
	}
	o = algorithms.Override{Events: b.Events, Burst: b.Burst, Block: b.Block, Unlimited: b.Unlimited}
	if b.Window != "" {
		d, err := caddy.ParseDuration(b.Window)
		if err != nil || d < time.Millisecond || d%time.Millisecond != 0 {
			return o, "", apiErr(http.StatusBadRequest, "field window: want a duration of whole milliseconds, at least 1ms (\"1m\"), got %q", b.Window)
		}
		o.Window = d.Milliseconds()
	}
	switch {
	case b.Events < 0:
		return o, "", apiErr(http.StatusBadRequest, "field events: must be positive, got %d", b.Events)
	case b.Burst < 0:
		return o, "", apiErr(http.StatusBadRequest, "field burst: must not be negative, got %d", b.Burst)
	case !b.Block && !b.Unlimited && (b.Events == 0 || b.Window == ""):
		return o, "", apiErr(http.StatusBadRequest, "field events and field window: an override needs both (burst optional), or block: true, or unlimited: true")
	case len(b.Reason) > 512:
		return o, "", apiErr(http.StatusBadRequest, "field reason: at most 512 bytes")
	}
	ttl := DefaultOverrideTTL
	switch {
	case b.ExpiresIn != "" && b.Expires != "":
		return o, "", apiErr(http.StatusBadRequest, "field expires_in and field expires: give one")
	case b.ExpiresIn != "":
		if ttl, err = caddy.ParseDuration(b.ExpiresIn); err != nil || ttl <= 0 {
			return o, "", apiErr(http.StatusBadRequest, "field expires_in: want a positive duration (\"2h\"), got %q", b.ExpiresIn)
		}
	case b.Expires != "":
		at, err := time.Parse(time.RFC3339, b.Expires)
		if err != nil || !at.After(now) {
			return o, "", apiErr(http.StatusBadRequest, "field expires: want an RFC 3339 instant in the future (\"2026-12-08T06:00:00Z\"), got %q", b.Expires)
		}
		ttl = at.Sub(now)
	}
	if ttl > MaxOverrideTTL {
		return o, "", apiErr(http.StatusBadRequest, "field expires_in (or expires): at most %s from now", MaxOverrideTTL)
	}
	o.Expires = now.Add(ttl).UnixMilli()
	if err := o.Check(l, now.UnixMilli()); err != nil {
		field := "events"
		switch {
		case errors.Is(err, algorithms.ErrOverrideKind):
			field = "block, unlimited, events"
		case errors.Is(err, algorithms.ErrBurst), errors.Is(err, algorithms.ErrBurstNotAllowed):
			field = "burst"
		case errors.Is(err, algorithms.ErrWindow), errors.Is(err, algorithms.ErrTooSlow):
			field = "window"
		}
		return o, "", apiErr(http.StatusBadRequest, "field %s: %v", field, err)
	}
	return o, b.Reason, nil
}

// putOverride answers PUT .../overrides/<key|token>.
func putOverride(w http.ResponseWriter, r *http.Request, az *activeZone, st stores.Overrider, toks []identity.Token) error {
	now := time.Now()
	o, reason, err := parseOverride(r, az.Limit, now)
	if err != nil {
		return err
	}
	if len(toks) > 1 {
		// A raw key's tokens are set together or not at all (up to a race
		// with another instance's set, which the store's bound still holds).
		if err := roomFor(r.Context(), az, st, toks); err != nil {
			return err
		}
	}
	list := OverrideList{Zone: az.Name, Max: az.maxOverrides(), Overrides: []OverrideView{}}
	for _, tok := range toks {
		e := stores.OverrideEntry{Key: tok, Override: o, Reason: reason, By: r.RemoteAddr, At: now.UnixMilli()}
		if err := st.SetOverride(r.Context(), az.Name, e, az.maxOverrides()); err != nil {
			if errors.Is(err, stores.ErrTooManyOverrides) {
				return apiErr(http.StatusConflict, "zone %q holds its most overrides (max_overrides %d): delete one, or wait for one to expire", az.Name, az.maxOverrides())
			}
			return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
		}
		if local := localOverrider(az); local != nil {
			_ = local.SetOverride(r.Context(), az.Name, e, az.maxOverrides())
		}
		logOverride("override set", az.Name, &e, "")
		list.Overrides = append(list.Overrides, viewOf(&e))
	}
	_, _ = collect(r.Context(), az, st)
	return writeJSON(w, list)
}

// roomFor checks that the zone has room for the overrides of toks not set
// yet.
func roomFor(ctx context.Context, az *activeZone, st stores.Overrider, toks []identity.Token) error {
	n, expired, err := st.ExpireOverrides(ctx, az.Name)
	for i := range expired {
		logOverride("override expired", az.Name, &expired[i], "")
	}
	if err != nil {
		return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
	}
	have := make([]*stores.OverrideEntry, len(toks))
	if err := st.PeekOverrides(ctx, az.Name, toks, have); err != nil {
		return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
	}
	for _, h := range have {
		if h == nil {
			n++
		}
	}
	if n > az.maxOverrides() {
		return apiErr(http.StatusConflict, "zone %q holds its most overrides (max_overrides %d), and this key needs %d (one per key candidate): delete some, or wait for them to expire", az.Name, az.maxOverrides(), len(toks))
	}
	return nil
}

// deleteOverride answers DELETE .../overrides/<key|token>.
func deleteOverride(w http.ResponseWriter, r *http.Request, az *activeZone, st stores.Overrider, toks []identity.Token) error {
	list := OverrideList{Zone: az.Name, Max: az.maxOverrides(), Overrides: []OverrideView{}}
	for _, tok := range toks {
		e, ok, err := st.DeleteOverride(r.Context(), az.Name, tok)
		if err != nil {
			return apiErr(http.StatusServiceUnavailable, "zone %q: the store did not answer: %v", az.Name, err)
		}
		if local := localOverrider(az); local != nil {
			_, _, _ = local.DeleteOverride(r.Context(), az.Name, tok)
		}
		if ok {
			logOverride("override deleted", az.Name, &e, r.RemoteAddr)
			list.Overrides = append(list.Overrides, viewOf(&e))
		}
	}
	if len(list.Overrides) == 0 {
		return apiErr(http.StatusNotFound, "zone %q: no override in force for this key", az.Name)
	}
	_, _ = collect(r.Context(), az, st)
	return writeJSON(w, list)
}

// localOverrider is the zone's fail-local memory store, which gets the
// zone's overrides too (it decides while the shared store cannot: a
// reset reaches it likewise); nil when it has none.
func localOverrider(az *activeZone) stores.Overrider {
	if az.Local == nil || az.Local == az.Store {
		return nil
	}
	o, _ := az.Local.(stores.Overrider)
	return o
}

// logOverride writes one line of the audit.
func logOverride(msg, zone string, e *stores.OverrideEntry, deletedBy string) {
	v := viewOf(e)
	fields := []zap.Field{zap.String("zone", zone), zap.String("token", v.Token), zap.String("kind", v.Kind),
		zap.Int64("events", v.Events), zap.Int64("window_ms", v.WindowMs), zap.Int64("burst", v.Burst),
		zap.String("expires", v.Expires), zap.String("reason", v.Reason), zap.String("set_by", v.By), zap.String("set_at", v.At)}
	if deletedBy != "" {
		fields = append(fields, zap.String("deleted_by", deletedBy))
	}
	overrideLog().Info(msg, fields...)
}

// The sweep: every overrideSweep, the active zones' ended overrides are
// collected (logged once, by whichever instance collects them first) and
// the counts in force reported. Started with the first registered handler.
var sweepOnce sync.Once

func startSweep() {
	sweepOnce.Do(func() {
		go func() {
			t := time.NewTicker(overrideSweep)
			defer t.Stop()
			for range t.C {
				sweepOverrides()
			}
		}()
	})
}

func sweepOverrides() {
	for _, az := range activeZones() {
		st, ok := az.Store.(stores.Overrider)
		if !ok || az.Limit.Algorithm == algorithms.Concurrency || az.Sync {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, expired, err := st.ExpireOverrides(ctx, az.Name)
		cancel()
		for i := range expired {
			logOverride("override expired", az.Name, &expired[i], "")
		}
		if err == nil && az.OverridesInForce != nil {
			az.OverridesInForce(n)
		}
	}
}
