package memstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/caddy-sluice/algorithms"
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
	// MaxKeys bounds the number of keys (zone × client) held. The store is
	// split in 64 shards of ⌈max_keys/64⌉ keys each, so the bound is
	// max_keys rounded up to a multiple of 64. When a shard is full, a new
	// key first makes room by dropping the shard's keys already back to
	// full (which loses nothing; at most once a second per shard); failing
	// that, it displaces, of a sample of 8 keys, the one closest to full
	// (which hands its owner the least). A flood of new keys therefore
	// costs old clients their state only once the store is full of keys
	// that are all still refilling. A key takes 94 to 151 bytes of memory
	// (measured from 30,000 to 1,000,000 keys; the spread is the map's
	// fill), so the default holds about 150 MB at most; a sliding_log key
	// takes more (its events). Default: 1000000.
	MaxKeys int `json:"max_keys,omitempty"`

	// SweepInterval is how often keys that are back to full are dropped.
	// At least 1s. Default: 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	store   *Store
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
	m.store = v.(*Store)
	return nil
}

// Validate checks the configuration.
func (m *Memory) Validate() error {
	if m.MaxKeys < 0 {
		return fmt.Errorf("store memory: max_keys must be positive, got %d", m.MaxKeys)
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

// Take implements the store contract (see Store.Take).
func (m *Memory) Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
	return m.store.Take(ctx, reqs, out)
}

// Store returns the shared store (for tests and the admin API).
func (m *Memory) Store() *Store { return m.store }

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
)
