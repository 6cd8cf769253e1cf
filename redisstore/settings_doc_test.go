package redisstore

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/stores"
)

// settingsSection returns docs/redis.md's "Redis settings Sluice needs".
func settingsSection(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Redis settings Sluice needs\n")
	if !ok {
		t.Fatal(`docs/redis.md has no section "Redis settings Sluice needs"`)
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	return sec
}

// TestRedisSettingsDoc: the ACL rules docs/redis.md gives for each path,
// applied as written to a real Redis, let the store load without a
// problem, take that path, decide (admit, then refuse), arm its watch,
// read the eviction policy, and serve the admin API, without a warning;
// and the section names what the store logs and counts.
// overrideRules finds the rules the section adds for overrides.
var overrideRules = regexp.MustCompile("(?s)overrides through the admin API.*?takes, besides: `([^`]+)`")

func TestRedisSettingsDoc(t *testing.T) {
	sec := settingsSection(t)
	for _, s := range []string{
		"redis refuses this user a permission Sluice needs", "redis may evict Sluice's keys under memory pressure",
		"redis evicted keys for memory", "redis restarted empty", "redis restarted or failed over with its data",
		"the TLS handshake with redis failed", "caddy_rate_limit_store_evicted_keys_total", "caddy_rate_limit_store_restarts_total",
		"noeviction", "one full limit", "one more full limit per key per restart", "tls_ca", "tls_cert", "tls_key", "`noperm`", "`tls`", "`oom`",
	} {
		if !strings.Contains(sec, s) {
			t.Errorf("docs/redis.md, Redis settings Sluice needs, does not say %q", s)
		}
	}
	var rules []string
	for line := range strings.Lines(sec) {
		if strings.HasPrefix(line, "ACL SETUSER sluice ") {
			rules = append(rules, strings.TrimSpace(line))
		}
	}
	if len(rules) != 2 {
		t.Fatalf("docs/redis.md gives %d ACL rules, want 2 (Functions, EVALSHA)", len(rules))
	}
	srv := redistest.Start(t, "maxmemory-policy noeviction")
	for i, rule := range rules {
		evalsha := i == 1
		name := []string{"functions", "evalsha"}[i]
		t.Run(name, func(t *testing.T) {
			args := []any{}
			user := "doc-" + name
			for _, f := range strings.Fields(strings.Replace(rule, "ACL SETUSER sluice ", "ACL SETUSER "+user+" ", 1)) {
				if f == ">PASSWORD" {
					f = ">pw-" + user
				}
				args = append(args, f)
			}
			srv.Do(t, args...)
			s, logs := observedStore(t, "redis://"+user+":pw-"+user+"@"+srv.Addr)
			if p := s.Problem(); p != "" {
				t.Fatalf("a problem with the documented rule: %s", p)
			}
			if s.scripts.evalsha.Load() != evalsha {
				t.Fatalf("EVALSHA path: %v, want %v", s.scripts.evalsha.Load(), evalsha)
			}
			req := algorithms.Request{Zone: "doc", Key: freshKey(t), Limit: limit(t, 2, time.Hour, 0), Cost: 1}
			for j, want := range []bool{true, true, false} {
				if got := take(t, s, req)[0].Allowed; got != want {
					t.Fatalf("take %d: allowed %v", j, got)
				}
			}
			waitArmed(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			s.checkEviction(ctx)
			out, found := make([]algorithms.Decision, 1), make([]bool, 1)
			if err := s.PeekKeys(ctx, req.Zone, []algorithms.Key{req.Key}, req.Limit, out, found); err != nil || !found[0] {
				t.Fatalf("PeekKeys: %v, found %v", err, found[0])
			}
			if n, err := s.ResetKeys(ctx, req.Zone, []algorithms.Key{req.Key}); err != nil || n != 1 {
				t.Fatalf("ResetKeys: %d, %v", n, err)
			}
			if !take(t, s, req)[0].Allowed {
				t.Fatal("refused after the reset")
			}
			// The asynchronous mode's syncs (INCRBY, PEXPIRE, GET) under the
			// same rules: the counts land, nothing held back.
			sl := syncLimit(t, algorithms.SlidingWindow, 5, time.Hour)
			release, err := s.SyncZone("docsync", sl, time.Hour, 10)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			for range 2 {
				takeOne(t, s, "docsync", req.Key, sl)
			}
			s.async.Load().syncNow()
			if st, _ := s.SyncStatus("docsync"); st.Error != "" || st.Held != 0 {
				t.Fatalf("the sync under the documented rule: %+v", st)
			}
			if got := redisCount(t, srv, s, "docsync", req.Key, sl); got != 2 {
				t.Fatalf("Redis counts %d of the sync zone's 2", got)
			}
			// The overrides' rules, as the section gives them, added.
			ovArgs := []any{"ACL", "SETUSER", user}
			for _, f := range strings.Fields(overrideRules.FindStringSubmatch(sec)[1]) {
				ovArgs = append(ovArgs, f)
			}
			srv.Do(t, ovArgs...)
			e := stores.OverrideEntry{Key: req.Key, Override: algorithms.Override{Block: true, Expires: time.Now().Add(time.Hour).UnixMilli()}, At: time.Now().UnixMilli()}
			if err := s.SetOverride(ctx, req.Zone, e, 10); err != nil {
				t.Fatalf("SetOverride: %v", err)
			}
			if d := take(t, s, req)[0]; d.Allowed || !d.Overridden {
				t.Fatalf("under a block: %+v", d)
			}
			if live, _, err := s.Overrides(ctx, req.Zone); err != nil || len(live) != 1 {
				t.Fatalf("Overrides: %v %v", live, err)
			}
			if err := s.PeekOverrides(ctx, req.Zone, []algorithms.Key{req.Key}, make([]*stores.OverrideEntry, 1)); err != nil {
				t.Fatalf("PeekOverrides: %v", err)
			}
			if _, ok, err := s.DeleteOverride(ctx, req.Zone, req.Key); !ok || err != nil {
				t.Fatalf("DeleteOverride: %v %v", ok, err)
			}
			s.watch.once()
			for _, e := range logs.All() {
				if e.Level >= zapcore.InfoLevel {
					t.Errorf("logged with the documented rule: %s %v", e.Message, e.ContextMap())
				}
			}
		})
	}
}
