package redisstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/stores"
)

// TestACLWithoutFunctionsFallsBackToEvalsha: a user denied FUNCTION and
// FCALL (EVALSHA allowed) is decided through EVALSHA, and the limit holds
// exactly under C concurrent requests for one key.
func TestACLWithoutFunctionsFallsBackToEvalsha(t *testing.T) {
	srv := redistest.Start(t)
	url := srv.User(t, "nofn", "~*", "+@all", "-function", "-fcall", "-fcall_ro")
	s := newTestStore(t, url, "", testTimeout, 0)
	if p := s.Problem(); p != "" {
		t.Fatalf("the store reports a problem with EVALSHA allowed: %s", p)
	}
	const C, capacity = 40, 15
	req := algorithms.Request{Zone: "acl", Key: freshKey(t), Limit: limit(t, capacity, time.Hour, 0), Cost: 1}
	var allowed, failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range C {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out := make([]algorithms.Decision, 1)
			if err := s.Take(context.Background(), []algorithms.Request{req}, out); err != nil {
				failed.Add(1)
				t.Errorf("Take: %v", err)
				return
			}
			if out[0].Allowed {
				allowed.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if allowed.Load() != capacity || failed.Load() != 0 {
		t.Fatalf("%d concurrent requests: %d allowed, %d failed; want exactly %d allowed, 0 failed", C, allowed.Load(), failed.Load(), capacity)
	}
	if n := srv.CommandCount(t, "evalsha"); n < C {
		t.Fatalf("EVALSHA ran %d times for %d decisions", n, C)
	}
}

// TestACLMissingPermissionIsNamed: a permission no fallback cures is named
// at load (the probe, the store's Problem that the admin API and the live
// page show) and by every failed decision (error kind noperm), never as an
// unreachable Redis.
func TestACLMissingPermissionIsNamed(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name  string
		rules []string
		grant string
	}{
		{"no scripts", []string{"~*", "+@all", "-function", "-fcall", "-fcall_ro", "-evalsha", "-eval", "-script"}, "+evalsha"},
		{"no evalsha, functions", []string{"~*", "+@all", "-evalsha", "-eval", "-script", "-fcall"}, "+evalsha"},
		{"no TIME", []string{"~*", "+@all", "-time"}, "+time"},
		{"no SET", []string{"~*", "+@all", "-set"}, "+set"},
		{"keys", []string{"~other:*", "+@all"}, "~" + DefaultKeyPrefix + "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := srv.User(t, strings.ReplaceAll(tc.name, " ", "-"), tc.rules...)
			s := newTestStore(t, url, "", testTimeout, 0)
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			err := s.warm(ctx)
			cancel()
			var pe *permError
			if !errors.As(err, &pe) || !strings.Contains(pe.need, tc.grant) {
				t.Fatalf("warm: %v; want a permission error naming %s", err, tc.grant)
			}
			if p := s.Problem(); !strings.Contains(p, tc.grant) {
				t.Fatalf("Problem() = %q; want it to name %s", p, tc.grant)
			}
			req := algorithms.Request{Zone: "acl", Key: freshKey(t), Limit: limit(t, 5, time.Hour, 0), Cost: 1}
			err = s.Take(context.Background(), []algorithms.Request{req}, make([]algorithms.Decision, 1))
			var k stores.ErrorKind
			if !errors.As(err, &k) || k.StoreErrorKind() != "noperm" || !strings.Contains(err.Error(), tc.grant) {
				t.Fatalf("Take: %v; want an error of kind noperm naming %s", err, tc.grant)
			}
		})
	}
}

// TestACLProblemInAdminInfo: the module's admin description (the live
// page's store cell) carries the missing permission.
func TestACLProblemInAdminInfo(t *testing.T) {
	srv := redistest.Start(t)
	url := srv.User(t, "noev", "~*", "+@all", "-function", "-fcall", "-fcall_ro", "-evalsha", "-eval", "-script")
	m := provision(t, &Redis{URL: url})
	if p, _ := m.AdminInfo()["problem"].(string); !strings.Contains(p, "+evalsha") {
		t.Fatalf("AdminInfo problem = %q; want it to name +evalsha", p)
	}
	ok := provision(t, &Redis{URL: srv.URL(), KeyPrefix: "other:"})
	if p, set := ok.AdminInfo()["problem"]; set {
		t.Fatalf("AdminInfo of a store with every permission has a problem: %v", p)
	}
}
