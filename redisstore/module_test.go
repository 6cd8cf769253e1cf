package redisstore

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// provision provisions m and registers its Cleanup.
func provision(t *testing.T, m *Redis) *Redis {
	t.Helper()
	if err := m.Provision(caddyContext(t)); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	t.Cleanup(func() { _ = m.Cleanup() })
	return m
}

func moduleTake(t *testing.T, m *Redis, req algorithms.Request) algorithms.Decision {
	t.Helper()
	out := make([]algorithms.Decision, 1)
	if err := m.Take(context.Background(), []algorithms.Request{req}, out); err != nil {
		t.Fatalf("Take: %v", err)
	}
	return out[0]
}

func TestModuleResolvesPlaceholders(t *testing.T) {
	srv := redistest.Start(t)
	t.Setenv("SLUICE_TEST_REDIS_URL", srv.URL())
	viaEnv := provision(t, &Redis{URL: "{env.SLUICE_TEST_REDIS_URL}", Timeout: caddy.Duration(testTimeout)})
	literal := provision(t, &Redis{URL: srv.URL(), Timeout: caddy.Duration(testTimeout)})
	if viaEnv.Store != literal.Store {
		t.Fatal("{env.SLUICE_TEST_REDIS_URL} and the literal URL it holds give two stores: the placeholder was not resolved")
	}
	req := algorithms.Request{Zone: "env", Key: freshKey(t), Limit: limit(t, 3, time.Hour, 0), Cost: 1}
	if d := moduleTake(t, viaEnv, req); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("Take through the placeholder URL: %+v", d)
	}
	if keys := withoutCtl(scanAll(t, srv)); !slices.Equal(keys, []string{viaEnv.Store.Key("env", req.Key)}) {
		t.Fatalf("keys on the server: %q", keys)
	}
	if viaEnv.URL != "{env.SLUICE_TEST_REDIS_URL}" {
		t.Fatalf("Provision rewrote the configured URL to %q", viaEnv.URL)
	}
	// Defaults applied.
	d := provision(t, &Redis{URL: srv.URL()})
	if time.Duration(d.Timeout) != DefaultTimeout || d.KeyPrefix != DefaultKeyPrefix {
		t.Fatalf("defaults: timeout %v prefix %q", time.Duration(d.Timeout), d.KeyPrefix)
	}

	// A password from the environment authenticates, and appears nowhere.
	authed := redistest.Start(t)
	authed.Do(t, "ACL", "SETUSER", "sluice", "on", ">s3cretpw", "~*", "+@all")
	authed.Do(t, "ACL", "SETUSER", "default", "off")
	t.Setenv("SLUICE_TEST_REDIS_PASSWORD", "s3cretpw")
	wrong := provision(t, &Redis{URL: "redis://sluice:wrong-password@" + authed.Addr, Timeout: caddy.Duration(testTimeout)})
	if err := wrong.Take(context.Background(), []algorithms.Request{req}, make([]algorithms.Decision, 1)); err == nil {
		t.Fatal("a wrong password was accepted")
	}
	m := provision(t, &Redis{URL: "redis://sluice:{env.SLUICE_TEST_REDIS_PASSWORD}@" + authed.Addr, Timeout: caddy.Duration(testTimeout)})
	if d := moduleTake(t, m, req); !d.Allowed {
		t.Fatalf("Take with a password from the environment: %+v", d)
	}
	if strings.Contains(m.Key(), "s3cretpw") || strings.Contains(m.Key(), "sluice@") {
		t.Fatalf("Key() = %q reveals the URL", m.Key())
	}
}

func TestModuleSharesOneStore(t *testing.T) {
	srv := redistest.Start(t)
	cfg := func() *Redis { return &Redis{URL: srv.URL(), Timeout: caddy.Duration(testTimeout), PoolSize: 3} }
	m1 := cfg()
	if err := m1.Provision(caddyContext(t)); err != nil {
		t.Fatal(err)
	}
	m2 := cfg()
	if err := m2.Provision(caddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = m1.Cleanup(), m2.Cleanup() }) // no-ops once cleaned up below
	if m1.Store == nil || m1.Store != m2.Store || m1.Store.Client() != m2.Store.Client() || m1.Key() != m2.Key() {
		t.Fatalf("same config, different stores: %p %p", m1.Store, m2.Store)
	}
	// Another setting makes another store.
	other := provision(t, &Redis{URL: srv.URL(), Timeout: caddy.Duration(testTimeout), PoolSize: 3, KeyPrefix: "other:"})
	if other.Store == m1.Store || other.Key() == m1.Key() {
		t.Fatal("a different key_prefix shares the store")
	}

	req := algorithms.Request{Zone: "share", Key: freshKey(t), Limit: limit(t, 10, time.Hour, 0), Cost: 1}
	moduleTake(t, m1, req)
	old := m1.Store
	if err := m1.Cleanup(); err != nil {
		t.Fatalf("Cleanup m1: %v", err)
	}
	if d := moduleTake(t, m2, req); !d.Allowed || d.Remaining != 8 {
		t.Fatalf("m2 after m1's Cleanup: %+v", d)
	}
	if err := m2.Cleanup(); err != nil {
		t.Fatalf("Cleanup m2: %v", err)
	}
	// The last Cleanup closed the client.
	out := make([]algorithms.Decision, 1)
	if err := old.Take(context.Background(), []algorithms.Request{req}, out); err == nil {
		t.Fatal("Take on the store after every Cleanup succeeded: the client was not closed")
	}
	m3 := provision(t, cfg())
	if m3.Store == old {
		t.Fatal("Provision after every Cleanup reused the destroyed store")
	}
	if d := moduleTake(t, m3, req); !d.Allowed || d.Remaining != 7 {
		t.Fatalf("new store: %+v (the state lives in Redis: want remaining 7)", d)
	}
}

func TestModuleUnreachableRedisIsAWarning(t *testing.T) {
	frozen := redistest.Start(t)
	frozen.Freeze(t)
	for name, url := range map[string]string{
		"nothing listens": fmt.Sprintf("redis://127.0.0.1:%d", redistest.FreePort(t)),
		"frozen server":   frozen.URL(),
	} {
		t.Run(name, func(t *testing.T) {
			m := &Redis{URL: url}
			start := time.Now()
			if err := m.Provision(caddyContext(t)); err != nil {
				t.Fatalf("Provision with an unreachable Redis failed: %v", err)
			}
			t.Cleanup(func() { _ = m.Cleanup() })
			if el := time.Since(start); el > 1500*time.Millisecond {
				t.Fatalf("Provision took %v", el)
			}
			req := algorithms.Request{Zone: "down", Key: freshKey(t), Limit: limit(t, 10, time.Hour, 0), Cost: 1}
			for i := range 3 {
				el, err := timedTake(t, context.Background(), m.Store, []algorithms.Request{req}, make([]algorithms.Decision, 1))
				if err == nil || el > DefaultTimeout+DefaultLateReplyGrace+failMargin {
					t.Fatalf("Take %d against an unreachable Redis: error %v after %v", i, err, el)
				}
			}
		})
	}
}

func TestModuleRejectsMalformedURLs(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"redis://[::1", "malformed"},
		{"http://x", "unsupported scheme"},
		{"x", "unsupported scheme"},
		{"redis+sentinel://127.0.0.1:26379", "master_name"},
		{"rediss+sentinel://:s3cretpw@127.0.0.1:26379", "master_name"},
		{"redis://user:s3cretpw@[bad", "url"},
		{"redis://user:s3cretpw@127.0.0.1:6379/notadb", "url"},
		{"redis://user:s3cretpw@127.0.0.1:notaport", "url"},
		{"redis://127.0.0.1:6379?password=s3cretpw&bogus=1", "url"},
		{"redis://user:s3cretpw@127.0.0.1:6379/0?dial_timeout=abc", "url"},
		{"redis+sentinel://user:s3cretpw@127.0.0.1:1/x?master_name=m", "url"},
		{"redis+sentinel://user:s3cretpw@127.0.0.1:1?master_name=m&password=s3cretpw&db=x", "url"},
		{"redis+sentinel://user:s3cretpw@127.0.0.1:1?master_name=m&addr=nope", "url"},
	} {
		m := &Redis{URL: tc.url}
		err := m.Provision(caddyContext(t))
		if err == nil {
			_ = m.Cleanup()
			t.Errorf("Provision(%q) succeeded", tc.url)
			continue
		}
		if !strings.Contains(err.Error(), "store redis") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Provision(%q): %q; want a store redis error about %q", tc.url, err, tc.want)
		}
		if strings.Contains(err.Error(), "s3cretpw") {
			t.Errorf("Provision(%q): the error reveals the password: %q", tc.url, err)
		}
	}
	for name, m := range map[string]*Redis{
		"nothing":            {},
		"url and cluster":    {URL: "redis://127.0.0.1:1", Cluster: []string{"127.0.0.1:2"}},
		"bad cluster addr":   {Cluster: []string{"127.0.0.1"}},
		"negative timeout":   {URL: "redis://127.0.0.1:1", Timeout: -1},
		"negative pool":      {URL: "redis://127.0.0.1:1", PoolSize: -1},
		"prefix with braces": {URL: "redis://127.0.0.1:1", KeyPrefix: "a{b}"},
		"prefix with brace":  {URL: "redis://127.0.0.1:1", KeyPrefix: "app}"},
	} {
		if err := m.Validate(); err == nil || !strings.HasPrefix(err.Error(), "store redis") {
			t.Errorf("Validate %s: %v", name, err)
		}
		if err := m.Provision(caddyContext(t)); err == nil {
			_ = m.Cleanup()
			t.Errorf("Provision %s succeeded", name)
		}
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	parse := func(in string) (*Redis, error) {
		r := new(Redis)
		err := r.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		return r, err
	}
	r, err := parse("redis redis://127.0.0.1:6379 {\n\ttimeout 50ms\n\tkey_prefix app:\n\tpool_size 5\n\tpipelines 3\n}")
	if err != nil {
		t.Fatal(err)
	}
	if r.URL != "redis://127.0.0.1:6379" || time.Duration(r.Timeout) != 50*time.Millisecond || r.KeyPrefix != "app:" || r.PoolSize != 5 || r.Pipelines != 3 || len(r.Cluster) != 0 {
		t.Fatalf("parsed %+v", r)
	}
	r, err = parse("redis {\n\tcluster 127.0.0.1:7000 127.0.0.1:7001\n}")
	if err != nil {
		t.Fatal(err)
	}
	if r.URL != "" || !slices.Equal(r.Cluster, []string{"127.0.0.1:7000", "127.0.0.1:7001"}) {
		t.Fatalf("parsed %+v", r)
	}
	r, err = parse("redis {\n\turl rediss://h:6380/2\n}")
	if err != nil || r.URL != "rediss://h:6380/2" {
		t.Fatalf("url in the block: %+v, %v", r, err)
	}
	r, err = parse("redis {\n\tcluster 10.0.0.1:7000\n\tusername u\n\tpassword {env.REDIS_PW}\n\ttls\n}")
	if err != nil || r.Username != "u" || r.Password != "{env.REDIS_PW}" || !r.TLS {
		t.Fatalf("cluster credentials: %+v, %v", r, err)
	}
	r, err = parse("redis redis://127.0.0.1:6379")
	if err != nil || r.URL != "redis://127.0.0.1:6379" {
		t.Fatalf("no block: %+v, %v", r, err)
	}

	for _, in := range []string{
		"redis redis://h:1 {\n\tbogus 1\n}",
		"redis redis://h:1 {\n\ttimeout 1s\n\ttimeout 2s\n}",
		"redis redis://h:1 {\n\tpool_size 2\n\tpool_size 2\n}",
		"redis {\n\tcluster 127.0.0.1:7000\n\tcluster 127.0.0.1:7001\n}",
		"redis redis://h:1 {\n\tcluster 127.0.0.1:7000\n}",
		"redis {\n\turl redis://h:1\n\tcluster 127.0.0.1:7000\n}",
		"redis redis://h:1 {\n\turl redis://h:2\n}",
		"redis redis://h:1 {\n\ttimeout abc\n}",
		"redis redis://h:1 {\n\ttimeout -5ms\n}",
		"redis redis://h:1 {\n\ttimeout 0\n}",
		"redis redis://h:1 {\n\ttimeout\n}",
		"redis redis://h:1 {\n\ttimeout 1s 2s\n}",
		"redis redis://h:1 {\n\tkey_prefix a{b\n}",
		"redis redis://h:1 {\n\tkey_prefix app}\n}",
		"redis redis://h:1 {\n\tpool_size 0\n}",
		"redis redis://h:1 {\n\tpool_size x\n}",
		"redis redis://h:1 {\n\tpipelines 0\n}",
		"redis redis://h:1 {\n\tpipelines 65\n}",
		"redis redis://h:1 {\n\tpipelines two\n}",
		"redis redis://h:1 {\n\tpipelines 2\n\tpipelines 2\n}",
		"redis redis://h:1 {\n\ttls yes\n}",
		"redis redis://a:1 redis://b:1",
		"redis",
		"redis {\n\tcluster\n}",
		"redis {\n\tcluster not-an-address\n}",
		"redis redis://u:s3cretpw@h:1 {\n\tbogus\n}",
	} {
		r, err := parse(in)
		if err == nil {
			t.Errorf("accepted %q: %+v", in, r)
			continue
		}
		if strings.Contains(err.Error(), "s3cretpw") {
			t.Errorf("%q: the error reveals the password: %v", in, err)
		}
	}
}

// TestPoolReuse counts the server's client connections: a second module
// with the same config (a reload) adds none, and the pool bounds them:
// decisions use at most pool_size pipeline connections (one per pipeline
// and one per spare, within pool_size); the command pool keeps (at most)
// the startup check's connection and the deny cache watcher's.
func TestPoolReuse(t *testing.T) {
	srv := redistest.Start(t)
	conns := func() int { return srv.ConnectedClients(t) - 1 } // minus the asking connection
	cfg := func() *Redis { return &Redis{URL: srv.URL(), Timeout: caddy.Duration(testTimeout), PoolSize: 4} }
	l := limit(t, 1_000_000, time.Hour, 0)
	burst := func(m *Redis, n int) {
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]algorithms.Decision, 1)
				if err := m.Take(context.Background(), []algorithms.Request{{Zone: "pool", Key: freshKey(t), Limit: l, Cost: 1}}, out); err != nil {
					t.Errorf("burst Take: %v", err)
				}
			}()
		}
		wg.Wait()
	}
	seq := func(m *Redis, n int) {
		key := freshKey(t)
		for range n {
			moduleTake(t, m, algorithms.Request{Zone: "pool", Key: key, Limit: l, Cost: 1})
		}
	}

	c0 := conns()
	m1 := cfg()
	if err := m1.Provision(caddyContext(t)); err != nil {
		t.Fatal(err)
	}
	cProv := conns()
	seq(m1, 200)
	cSeq := conns()
	for range 3 {
		burst(m1, 40)
	}
	cBurst := conns()
	m2 := cfg() // a reload: same config
	if err := m2.Provision(caddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = m1.Cleanup(), m2.Cleanup() }) // no-ops once cleaned up below
	cReload := conns()
	seq(m2, 200)
	for range 3 {
		burst(m2, 40)
	}
	cAfter := conns()
	list := clientList(t, srv)
	if err := m1.Cleanup(); err != nil {
		t.Fatal(err)
	}
	cOneLeft := conns()
	if err := m2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	cGone := -1
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cGone = conns(); cGone == 0 {
			break
		}
	}
	t.Logf("pool_size 4: connections before %d, after Provision %d, after 200 sequential Takes %d, after 3 bursts of 40 %d, "+
		"after a second Provision %d, after 200+120 more Takes through it %d, after one Cleanup %d, after both %d; CLIENT LIST: %s",
		c0, cProv, cSeq, cBurst, cReload, cAfter, cOneLeft, cGone, list)
	// pool_size pipeline connections, plus the command pool's: the startup
	// check's and the deny cache watcher's (one connection when their first
	// calls do not overlap, two when they do).
	const most = 4 + 2
	if c0 != 0 || cSeq > most || cBurst > most || cReload != cBurst || cAfter > most || cOneLeft != cAfter || cGone != 0 {
		t.Fatal("connections grew beyond the pool, or a reload / Cleanup changed them (numbers above)")
	}

	// The default pool size: 10 per CPU.
	m3 := provision(t, &Redis{URL: srv.URL(), Timeout: caddy.Duration(testTimeout)})
	for range 3 {
		burst(m3, 60)
	}
	cDefault := conns()
	t.Logf("default pool size (GOMAXPROCS %d): %d connections after 3 bursts of 60 concurrent Takes", runtime.GOMAXPROCS(0), cDefault)
	if cDefault > 10*runtime.GOMAXPROCS(0) || cDefault < 1 {
		t.Fatalf("default pool: %d connections", cDefault)
	}
}

// clientList summarises CLIENT LIST: connections by library and last command.
func clientList(t *testing.T, srv *redistest.Server) string {
	t.Helper()
	v, _ := srv.Do(t, "CLIENT", "LIST").(string)
	counts := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(v), "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(line) {
			k, val, _ := strings.Cut(kv, "=")
			f[k] = val
		}
		if f["cmd"] == "client|list" {
			continue // the asking connection
		}
		counts[fmt.Sprintf("lib=%s cmd=%s", f["lib-name"], f["cmd"])]++
	}
	var parts []string
	for k, n := range counts {
		parts = append(parts, fmt.Sprintf("%d×[%s]", n, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}
