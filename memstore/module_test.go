package memstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

func caddyCtx(t *testing.T) caddy.Context {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx
}

func provision(t *testing.T, m *Memory) *Memory {
	t.Helper()
	if err := m.Provision(caddyCtx(t)); err != nil {
		t.Fatalf("Provision(%+v): %v", m, err)
	}
	return m
}

// stopped reports whether the store's sweeper has been stopped (Destruct ran).
func stopped(s *Store) bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func TestModuleInfo(t *testing.T) {
	info := Memory{}.CaddyModule()
	if info.ID != "http.handlers.rate_limit.stores.memory" {
		t.Fatalf("ID %q", info.ID)
	}
	if _, ok := info.New().(*Memory); !ok {
		t.Fatalf("New returns %T", info.New())
	}
	if _, err := caddy.GetModule("http.handlers.rate_limit.stores.memory"); err != nil {
		t.Fatalf("module not registered: %v", err)
	}
}

func TestModuleSharesStoreAcrossInstances(t *testing.T) {
	// A configuration no other test uses, so the pool starts empty for it.
	cfg := func() *Memory { return &Memory{MaxKeys: 4242, SweepInterval: caddy.Duration(7 * time.Second)} }
	m1 := provision(t, cfg())
	m2 := provision(t, cfg())
	if m1.Store == nil || m1.Store != m2.Store {
		t.Fatalf("same configuration, different stores: %p %p", m1.Store, m2.Store)
	}
	shared := m1.Store

	// A different configuration gets its own store.
	other := provision(t, &Memory{MaxKeys: 4243, SweepInterval: caddy.Duration(7 * time.Second)})
	if other.Store == shared {
		t.Fatalf("different configurations share a store")
	}
	if err := other.Cleanup(); err != nil {
		t.Fatal(err)
	}

	// State written through one is seen through the other.
	l := algorithms.Limit{Events: 5, Window: 3_600_000}
	k := keyOf(42)
	out := make([]algorithms.Decision, 1)
	for range 5 {
		if err := m1.Take(context.Background(), []algorithms.Request{req("z", k, l, 1)}, out); err != nil || !out[0].Allowed {
			t.Fatalf("m1 take: %+v %v", out[0], err)
		}
	}
	if _ = m2.Take(context.Background(), []algorithms.Request{req("z", k, l, 1)}, out); out[0].Allowed {
		t.Fatalf("m2 does not see m1's spend: %+v", out[0])
	}

	// Cleanup of one keeps the store alive while the other holds it: a
	// reload that provisions the same configuration gets the same store,
	// counters included.
	if err := m1.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if stopped(shared) {
		t.Fatalf("store destructed while m2 still holds it")
	}
	m3 := provision(t, cfg())
	if m3.Store != shared {
		t.Fatalf("reload got a new store: counters lost")
	}
	if _ = m3.Take(context.Background(), []algorithms.Request{req("z", k, l, 1)}, out); out[0].Allowed || out[0].Remaining != 0 {
		t.Fatalf("reloaded store lost the counter: %+v", out[0])
	}

	// When the last holder lets go, the store is destructed (sweeper
	// stopped) and the next provision starts afresh.
	if err := m2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if stopped(shared) {
		t.Fatalf("store destructed while m3 still holds it")
	}
	if err := m3.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if !stopped(shared) {
		t.Fatalf("store not destructed after its last holder's Cleanup")
	}
	m4 := provision(t, cfg())
	defer m4.Cleanup()
	if m4.Store == shared {
		t.Fatalf("a destructed store was handed out again")
	}
	if _ = m4.Take(context.Background(), []algorithms.Request{req("z", k, l, 1)}, out); !out[0].Allowed || out[0].Remaining != 4 {
		t.Fatalf("fresh store: %+v", out[0])
	}
	// Cleanup of a module that was never provisioned is harmless.
	if err := (&Memory{}).Cleanup(); err != nil {
		t.Fatal(err)
	}
}

func TestModuleDefaultsAndValidate(t *testing.T) {
	m := provision(t, &Memory{})
	defer m.Cleanup()
	if m.MaxKeys != DefaultMaxKeys || time.Duration(m.SweepInterval) != DefaultSweepInterval {
		t.Fatalf("defaults: %+v", m)
	}
	if m.Key() != "memory max_keys=1000000 sweep_interval=1m0s" {
		t.Fatalf("Key %q", m.Key())
	}
	// Explicit defaults are the same configuration, hence the same store.
	m2 := provision(t, &Memory{MaxKeys: DefaultMaxKeys, SweepInterval: caddy.Duration(time.Minute)})
	defer m2.Cleanup()
	if m2.Store != m.Store {
		t.Fatalf("explicit defaults got another store")
	}
	for _, bad := range []*Memory{{MaxKeys: -1}, {SweepInterval: -1}} {
		if err := bad.Provision(caddyCtx(t)); err == nil {
			_ = bad.Cleanup()
			t.Fatalf("Provision(%+v) accepted", bad)
		}
		if bad.Store != nil {
			t.Fatalf("a refused config got a store")
		}
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	m := new(Memory)
	d := caddyfile.NewTestDispenser("memory {\n\tmax_keys 10\n\tsweep_interval 5s\n}")
	if err := m.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if m.MaxKeys != 10 || time.Duration(m.SweepInterval) != 5*time.Second {
		t.Fatalf("parsed %+v", m)
	}

	// The way the rate_limit directive hands it over: `store memory { ... }`.
	d = caddyfile.NewTestDispenser("store memory {\n\tmax_keys 10\n\tsweep_interval 5s\n}")
	d.Next()
	if !d.NextArg() || d.Val() != "memory" {
		t.Fatalf("dispenser at %q", d.Val())
	}
	unm, err := caddyfile.UnmarshalModule(d, "http.handlers.rate_limit.stores.memory")
	if err != nil {
		t.Fatal(err)
	}
	if mm, ok := unm.(*Memory); !ok || mm.MaxKeys != 10 || time.Duration(mm.SweepInterval) != 5*time.Second {
		t.Fatalf("UnmarshalModule: %#v", unm)
	}

	// No block: the defaults (applied at Provision).
	m = new(Memory)
	if err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser("memory")); err != nil || m.MaxKeys != 0 || m.SweepInterval != 0 {
		t.Fatalf("bare memory: %+v %v", m, err)
	}

	for _, tc := range []struct{ in, wantErr string }{
		{"memory {\n\tbogus 1\n}", "unknown option"},
		{"memory {\n\tmax_keys 10\n\tmax_keys 20\n}", "duplicate"},
		{"memory {\n\tsweep_interval 1s\n\tsweep_interval 2s\n}", "duplicate"},
		{"memory {\n\tmax_keys 0\n}", "max_keys"},
		{"memory {\n\tmax_keys -5\n}", "max_keys"},
		{"memory {\n\tmax_keys ten\n}", "max_keys"},
		{"memory {\n\tmax_keys 1.5\n}", "max_keys"},
		{"memory {\n\tmax_keys 99999999999999999999\n}", "max_keys"},
		{"memory {\n\tsweep_interval 0\n}", "sweep_interval"},
		{"memory {\n\tsweep_interval 0s\n}", "sweep_interval"},
		{"memory {\n\tsweep_interval -5s\n}", "sweep_interval"},
		{"memory {\n\tsweep_interval soon\n}", "sweep_interval"},
		{"memory {\n\tmax_keys\n}", "needs a value"},
		{"memory {\n\tmax_keys 1 2\n}", "one value"},
		{"memory extra", "argument"},
	} {
		m := new(Memory)
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), tc.wantErr) {
			t.Errorf("%q: error %v, want one mentioning %q", tc.in, err, tc.wantErr)
		}
	}
}
