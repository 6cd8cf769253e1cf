package memstore

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/caddy-sluice/stores"
)

func init() {
	caddy.RegisterModule(Memory{})
}

// pool keeps stores alive across config reloads: a reload that keeps a
// store's configuration keeps every counter in it.
var pool = caddy.NewUsagePool()

// Memory is the embedded store, the default: rate limit state in this Caddy
// process's memory. Every rate_limit directive with the same memory store
// configuration shares one store, and the store outlives config reloads
// that keep that configuration.
type Memory struct {
	// MaxKeys bounds the keys (zone × client) held, rounded up to a
	// multiple of 64 (the shards). A full shard drops its keys back to
	// full, then the key closest to full of a sample of 8 (the rule and
	// its memory: docs/reference.md, "Store memory"). At most
	// 1000000000. Default: 1000000 (about 150 MB at most).
	MaxKeys int `json:"max_keys,omitempty"`

	// SweepInterval is how often keys that are back to full are dropped.
	// At least 1s. Default: 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// Store is the shared store of this configuration, set at Provision:
	// its methods (Take, Refund, Release, PeekKeys, ResetKeys) are the
	// module's.
	*Store  `json:"-"`
	poolKey string
}

// CaddyModule returns the Caddy module information.
func (Memory) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit.stores.memory",
		New: func() caddy.Module { return new(Memory) },
	}
}

// keysGauge reports the keys held by every memory store of the process,
// created once and registered in each configuration's metrics registry.
var keysGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
	Namespace: "caddy", Subsystem: "rate_limit", Name: "memory_keys",
	Help: "Keys (zone × client) held by the rate limit memory stores.",
}, func() float64 {
	n := 0
	pool.Range(func(_, v any) bool {
		n += v.(*Store).Len()
		return true
	})
	return float64(n)
})

// Provision sets defaults and attaches the shared store of this configuration.
func (m *Memory) Provision(ctx caddy.Context) error {
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := reg.Register(keysGauge); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return fmt.Errorf("store memory: registering metrics: %w", err)
		}
	}
	if m.MaxKeys == 0 {
		m.MaxKeys = DefaultMaxKeys
	}
	if m.SweepInterval == 0 {
		m.SweepInterval = caddy.Duration(DefaultSweepInterval)
	}
	if err := m.Validate(); err != nil {
		return err
	}
	m.poolKey = m.Key()
	v, _, err := pool.LoadOrNew(m.poolKey, func() (caddy.Destructor, error) {
		return New(Config{MaxKeys: m.MaxKeys, SweepInterval: time.Duration(m.SweepInterval)}), nil
	})
	if err != nil {
		return err
	}
	m.Store = v.(*Store)
	return nil
}

// Validate checks the configuration.
func (m *Memory) Validate() error {
	if m.MaxKeys < 0 || m.MaxKeys > MaxMaxKeys {
		return fmt.Errorf("store memory: max_keys must be between 1 and %d, got %d", MaxMaxKeys, m.MaxKeys)
	}
	if m.SweepInterval != 0 && time.Duration(m.SweepInterval) < MinSweepInterval {
		return fmt.Errorf("store memory: sweep_interval must be at least %s, got %s", MinSweepInterval, time.Duration(m.SweepInterval))
	}
	return nil
}

// Key identifies the store's configuration: directives whose stores have
// the same key share state.
func (m *Memory) Key() string {
	return "memory max_keys=" + strconv.Itoa(m.MaxKeys) + " sweep_interval=" + time.Duration(m.SweepInterval).String()
}

// Cleanup releases this configuration's hold on the shared store.
func (m *Memory) Cleanup() error {
	if m.poolKey == "" {
		return nil
	}
	_, err := pool.Delete(m.poolKey)
	return err
}

// UnmarshalCaddyfile sets up the store from Caddyfile tokens. Syntax:
//
//	store memory {
//	    max_keys       <n>
//	    sweep_interval <duration>
//	}
func (m *Memory) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the store's name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		field := d.Val()
		if seen[field] {
			return d.Errf("store memory: duplicate %s", field)
		}
		seen[field] = true
		if !d.NextArg() {
			return d.Errf("store memory: %s needs a value", field)
		}
		val := d.Val()
		if d.NextArg() {
			return d.Errf("store memory: %s takes one value", field)
		}
		switch field {
		case "max_keys":
			n, err := strconv.Atoi(val)
			if err != nil || n <= 0 {
				return d.Errf("store memory: max_keys must be a positive integer, got %q", val)
			}
			m.MaxKeys = n
		case "sweep_interval":
			dur, err := caddy.ParseDuration(val)
			if err != nil || dur <= 0 {
				return d.Errf("store memory: sweep_interval must be a positive duration, got %q", val)
			}
			m.SweepInterval = caddy.Duration(dur)
		default:
			return d.Errf("store memory: unknown option %q (known: max_keys, sweep_interval)", field)
		}
		if err := m.Validate(); err != nil {
			return d.WrapErr(err) // named at its line, as JSON is at load
		}
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner     = (*Memory)(nil)
	_ caddy.Validator       = (*Memory)(nil)
	_ caddy.CleanerUpper    = (*Memory)(nil)
	_ caddyfile.Unmarshaler = (*Memory)(nil)
	_ caddy.Destructor      = (*Store)(nil)

	// The store contract (package stores): the store's capabilities, and
	// the module's (the store's, embedded, and its own).
	_ stores.Store     = (*Store)(nil)
	_ stores.Refunder  = (*Store)(nil)
	_ stores.Settler   = (*Store)(nil)
	_ stores.Releaser  = (*Store)(nil)
	_ stores.Admin     = (*Store)(nil)
	_ stores.Store     = (*Memory)(nil)
	_ stores.Refunder  = (*Memory)(nil)
	_ stores.Settler   = (*Memory)(nil)
	_ stores.Releaser  = (*Memory)(nil)
	_ stores.Admin     = (*Memory)(nil)
	_ stores.Keyed     = (*Memory)(nil)
	_ stores.SlotHeir  = (*Memory)(nil)
	_ stores.Described = (*Memory)(nil)
)
