package sluice

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestSyncCaddyfile: `sync <interval> [<max_keys>]` parses into Zone.Sync,
// and its values are checked at load.
func TestSyncCaddyfile(t *testing.T) {
	for _, c := range []struct {
		line     string
		interval time.Duration
		keys     int
		err      string
	}{
		{line: "sync 50ms", interval: 50 * time.Millisecond},
		{line: "sync 1s 5000", interval: time.Second, keys: 5000},
		{line: "sync", err: "sync takes an interval"},
		{line: "sync 1s 5 6", err: "sync takes an interval"},
		{line: "sync soon", err: "invalid duration"},
		{line: "sync 1ms", err: "sync: the interval must be between 10ms and 1m0s"},
		{line: "sync 2m", err: "sync: the interval must be between"},
		{line: "sync 1s 0", err: "at least 1"},
		{line: "sync 1s 20000000", err: "sync: max_keys must be between 1 and 10000000"},
	} {
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`rate_limit {
			zone z {
				events 100
				window 1m
				algorithm fixed_window
				` + c.line + `
			}
		}`))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want one saying %q", c.line, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.line, err)
			continue
		}
		s := h.RateLimits["z"].Sync
		if s == nil || time.Duration(s.Interval) != c.interval || s.MaxKeys != c.keys {
			t.Errorf("%q: %+v, want interval %s max_keys %d", c.line, s, c.interval, c.keys)
		}
	}
}

// TestSyncRefusedAtLoad: the algorithms whose counts do not add later, and
// the settings that need every request decided by the store, are refused
// at load, naming the zone, sync, the reason and the file and line of the
// sync setting.
func TestSyncRefusedAtLoad(t *testing.T) {
	for _, c := range []struct{ lines, want string }{
		{"events 100\nwindow 1m", "sync: not with token_bucket"},
		{"events 100\nwindow 1m\nalgorithm gcra", "sync: not with gcra"},
		{"events 100\nwindow 1m\nalgorithm sliding_log", "sync: not with sliding_log"},
		{"events 100\nwindow 1m\nalgorithm fixed_window\ncount 401", "sync: not with count"},
		{"events 100\nwindow 1m\nalgorithm sliding_window\nsettle header X-Cost", "sync: not with settle"},
		{"events 100\nwindow 1m\nalgorithm fixed_window\npenalty 1m", "sync: not with penalty"},
		{"events 100\nwindow 1m\nalgorithm fixed_window\nlocal_allowance", "local_allowance"},
		{"concurrent 10", "sync: not with concurrent"},
		{"events 100\nwindow 1m\nalgorithm fixed_window\nmax_overrides 10", "sync: not with max_overrides"},
		{"events {http.request.header.X-N} 60\nwindow 1m\nalgorithm fixed_window", "sync: not with a limit chosen per request"},
	} {
		h := new(Handler)
		src := "rate_limit {\nzone z {\n" + c.lines + "\nsync 50ms\n}\n}"
		line := strings.Count(src[:strings.Index(src, "sync 50ms")], "\n") + 1
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(src))
		if err == nil || !strings.Contains(err.Error(), `"z"`) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a refusal naming zone z and %q", c.lines, err, c.want)
			continue
		}
		if at := "Testfile:" + strconv.Itoa(line); !strings.Contains(err.Error(), at) {
			t.Errorf("%s: %v, want the place of sync (%s)", c.lines, err, at)
		}
	}
}

// TestSyncNeedsRedis: the memory store decides every request here already;
// sync is refused with it at Provision, naming store redis.
func TestSyncNeedsRedis(t *testing.T) {
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`rate_limit {
		zone z {
			events 100
			window 1m
			algorithm sliding_window
			sync 50ms
		}
	}`)); err != nil {
		t.Fatal(err)
	}
	err := h.Provision(caddyContext(t))
	_ = h.Cleanup()
	if err == nil || !strings.Contains(err.Error(), "store redis") || !strings.Contains(err.Error(), `"z"`) {
		t.Errorf("Provision: %v, want a refusal naming zone z and store redis", err)
	}
}

// TestDistributedCaddyfile: caddy-ratelimit's distributed block puts every
// zone in the asynchronous mode at min(read_interval, write_interval), a
// zone without an algorithm as a sliding_window; an explicit algorithm
// that cannot sync is refused at distributed's line.
func TestDistributedCaddyfile(t *testing.T) {
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`rate_limit {
		zone a {
			key {remote_host}
			events 100
			window 1m
		}
		zone b {
			events 10
			window 1h
			algorithm fixed_window
		}
		distributed {
			read_interval 2s
			write_interval 500ms
			purge_age 1m
		}
	}`)); err != nil {
		t.Fatal(err)
	}
	for name, alg := range map[string]string{"a": "sliding_window", "b": "fixed_window"} {
		z := h.RateLimits[name]
		if z.Sync == nil || time.Duration(z.Sync.Interval) != 500*time.Millisecond || z.Algorithm != alg {
			t.Errorf("zone %s: sync %+v, algorithm %q; want 500ms and %s", name, z.Sync, z.Algorithm, alg)
		}
	}
	err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("rate_limit {\nzone z {\nevents 1\nwindow 1m\nalgorithm gcra\n}\ndistributed {\nread_interval 1s\n}\n}"))
	if err == nil || !strings.Contains(err.Error(), "sync: not with gcra") || !strings.Contains(err.Error(), "Testfile:7") {
		t.Errorf("gcra under distributed: %v, want a refusal at distributed's line (Testfile:7)", err)
	}
	err = new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("rate_limit {\nzone z {\nevents 1\nwindow 1m\n}\ndistributed {\nread_interval 1ms\n}\n}"))
	if err == nil || !strings.Contains(err.Error(), "distributed: the sync interval") {
		t.Errorf("read_interval 1ms: %v, want a refusal of the interval", err)
	}
}
