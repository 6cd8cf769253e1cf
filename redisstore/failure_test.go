package redisstore

import (
	"context"
	"errors"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestFunctionFlushReloads: the decision is a Redis Function; after
// FUNCTION FLUSH the next Take meets "function not found" once, loads the
// library and runs; the one after is a single FCALL. Counts carry on.
func TestFunctionFlushReloads(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", 250*time.Millisecond, 0)
	req := algorithms.Request{Zone: "ns", Key: freshKey(t), Limit: limit(t, 100, time.Hour, 0), Cost: 1}
	probes := srv.CommandStats(t, "fcall").Calls // the load's permission probe (perm.go)
	take(t, s, req)
	if n := srv.CommandStats(t, "fcall").Calls - probes; n != 1 {
		t.Fatalf("the first Take made %d FCALLs, want 1 (the library loaded when the store was made)", n)
	}
	for round := range 3 {
		srv.Do(t, "FUNCTION", "FLUSH")
		f0, l0 := srv.CommandStats(t, "fcall"), srv.CommandStats(t, "function|load")
		d := take(t, s, req)
		if !d[0].Allowed || d[0].Remaining != int64(98-2*round) {
			t.Fatalf("round %d: after FUNCTION FLUSH: %+v", round, d[0])
		}
		f1, l1 := srv.CommandStats(t, "fcall"), srv.CommandStats(t, "function|load")
		if f1.Calls-f0.Calls != 2 || f1.Failed-f0.Failed != 1 || l1.Calls-l0.Calls != 1 || l1.Failed != l0.Failed {
			t.Fatalf("round %d: after FUNCTION FLUSH, want one failed FCALL, one FUNCTION LOAD, one FCALL: fcall %+v → %+v, function|load %+v → %+v",
				round, f0, f1, l0, l1)
		}
		take(t, s, req)
		f2, l2 := srv.CommandStats(t, "fcall"), srv.CommandStats(t, "function|load")
		if f2.Calls-f1.Calls != 1 || f2.Failed != f1.Failed || l2.Calls != l1.Calls {
			t.Fatalf("round %d: the Take after the reload: fcall %+v → %+v, function|load %+v → %+v", round, f1, f2, l1, l2)
		}
	}
}

// TestWithoutFunctionsFallsBackToEvalSha: on a server without Functions
// (Redis before 7; here FCALL and FUNCTION renamed away) the store runs the
// same code with EVALSHA, and after SCRIPT FLUSH meets NOSCRIPT once and
// sends EVAL, which caches the script again.
func TestWithoutFunctionsFallsBackToEvalSha(t *testing.T) {
	srv := redistest.Start(t, `rename-command FCALL ""`, `rename-command FUNCTION ""`)
	s := newTestStore(t, srv.URL(), "", 250*time.Millisecond, 0)
	req := algorithms.Request{Zone: "ns", Key: freshKey(t), Limit: limit(t, 100, time.Hour, 0), Cost: 1}
	take(t, s, req) // the script was loaded with the store

	for round := range 3 {
		srv.Do(t, "SCRIPT", "FLUSH")
		sha0, ev0 := srv.CommandStats(t, "evalsha"), srv.CommandStats(t, "eval")
		d := take(t, s, req)
		if !d[0].Allowed || d[0].Remaining != int64(98-2*round) {
			t.Fatalf("round %d: after SCRIPT FLUSH: %+v", round, d[0])
		}
		sha1, ev1 := srv.CommandStats(t, "evalsha"), srv.CommandStats(t, "eval")
		if sha1.Calls-sha0.Calls != 1 || sha1.Failed-sha0.Failed != 1 || ev1.Calls-ev0.Calls != 1 || ev1.Failed != ev0.Failed {
			t.Fatalf("round %d: after SCRIPT FLUSH, want one failed EVALSHA (NOSCRIPT) and one EVAL: evalsha %+v → %+v, eval %+v → %+v",
				round, sha0, sha1, ev0, ev1)
		}
		// EVAL cached it: the next Take is one successful EVALSHA.
		take(t, s, req)
		sha2, ev2 := srv.CommandStats(t, "evalsha"), srv.CommandStats(t, "eval")
		if sha2.Calls-sha1.Calls != 1 || sha2.Failed != sha1.Failed || ev2.Calls != ev1.Calls {
			t.Fatalf("round %d: the Take after the reload: evalsha %+v → %+v, eval %+v → %+v", round, sha1, sha2, ev1, ev2)
		}
	}
	// A store made before the server is known: its first call meets the
	// unknown FCALL, falls back, and decides.
	cold := newStoreWith(s.client, false, DefaultKeyPrefix, 250*time.Millisecond, redisPathOptions())
	defer cold.batch.close() // not Destruct: the client is s's
	out := make([]algorithms.Decision, 1)
	if err := cold.Take(context.Background(), []algorithms.Request{req}, out); err != nil || !out[0].Allowed || out[0].Remaining != 92 {
		t.Fatalf("a store that never loaded: %+v, %v; want allowed with 92 left", out[0], err)
	}
	if !cold.scripts.evalsha.Load() {
		t.Fatal("the store did not switch to EVALSHA after an unknown FCALL")
	}
}

// TestRedisRestartRecovers: after a restart on the same port (no data, no
// scripts, every pooled connection dead) decisions resume within a bounded
// number of attempts, none slower than the timeout.
func TestRedisRestartRecovers(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 50 * time.Millisecond
	s := newTestStore(t, srv.URL(), "", timeout, 0)
	l := limit(t, 100, time.Hour, 0)
	req := algorithms.Request{Zone: "restart", Key: freshKey(t), Limit: l, Cost: 1}
	// Warm several pooled connections so the restart leaves several dead.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Decision, 1)
			_ = s.Take(context.Background(), []algorithms.Request{req}, out)
		}()
	}
	wg.Wait()
	if d := take(t, s, req)[0]; !d.Allowed || d.Remaining != 91 {
		t.Fatalf("before the restart: %+v", d)
	}

	for _, how := range []string{"restart", "kill and restart"} {
		if how == "restart" {
			srv.Restart(t)
		} else {
			srv.Kill()
			srv.Restart(t)
		}
		deadline := time.Now().Add(2 * time.Second)
		var errs []string
		var d algorithms.Decision
		ok := false
		for attempt := 0; time.Now().Before(deadline); attempt++ {
			out := make([]algorithms.Decision, 1)
			el, err := timedTake(t, context.Background(), s, []algorithms.Request{req}, out)
			if el > timeout+failMargin {
				t.Fatalf("%s: attempt %d took %v (timeout %v)", how, attempt, el, timeout)
			}
			if err == nil {
				ok, d = true, out[0]
				break
			}
			errs = append(errs, err.Error())
			time.Sleep(10 * time.Millisecond)
		}
		if !ok {
			t.Fatalf("%s: no Take succeeded within 2s; errors: %q", how, errs)
		}
		// Nothing persists: the key starts over.
		if !d.Allowed || d.Remaining != 99 {
			t.Fatalf("%s: first decision %+v; want allowed, remaining 99 (the restarted server is empty)", how, d)
		}
		t.Logf("%s: %d failed attempt(s) before success: %q", how, len(errs), errs)
		if len(errs) > 8 {
			t.Fatalf("%s: %d failed attempts before success (8 dead pooled connections at most)", how, len(errs))
		}
	}
}

// failCase is one way for Redis to fail.
type failCase struct {
	name string
	// setup breaks the server (s is already warm: its pool holds a live
	// connection) and returns what the error must say, if anything.
	setup func(t *testing.T, srv *redistest.Server) *regexp.Regexp
	cold  bool   // also try a store that never connected
	kind  string // the kind its sequential errors name (StoreErrorKind), if one
}

func TestFailuresReturnErrorsWithinTimeout(t *testing.T) {
	cases := []failCase{
		{name: "connection refused", cold: true, setup: func(t *testing.T, srv *redistest.Server) *regexp.Regexp {
			srv.Stop()
			return nil
		}},
		{name: "frozen server", cold: true, kind: "timeout", setup: func(t *testing.T, srv *redistest.Server) *regexp.Regexp {
			srv.Freeze(t)
			t.Cleanup(func() {
				if srv.Running() {
					srv.Thaw(t)
				}
			})
			return nil
		}},
		{name: "READONLY replica", kind: "readonly", setup: func(t *testing.T, srv *redistest.Server) *regexp.Regexp {
			other := redistest.Start(t)
			srv.MakeReadOnlyReplicaOf(t, other)
			return regexp.MustCompile(`READONLY`)
		}},
		{name: "OOM", kind: "oom", setup: func(t *testing.T, srv *redistest.Server) *regexp.Regexp {
			srv.SetOOM(t)
			return regexp.MustCompile(`OOM`)
		}},
		{name: "wrong type", kind: "other", setup: func(t *testing.T, srv *redistest.Server) *regexp.Regexp {
			return regexp.MustCompile(`WRONGTYPE`)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			warm := newTestStore(t, srv.URL(), "", DefaultTimeout, 2)
			l := limit(t, 10, time.Hour, 0)
			req := algorithms.Request{Zone: "fail", Key: freshKey(t), Limit: l, Cost: 1}
			// Warm with a generous timeout on the same server, then break it.
			take(t, newTestStore(t, srv.URL(), "", testTimeout, 0), req)
			for range 3 {
				out := make([]algorithms.Decision, 1)
				if err := warm.Take(context.Background(), []algorithms.Request{req}, out); err != nil {
					t.Logf("warming Take (20ms): %v", err)
				}
			}
			want := tc.setup(t, srv)
			if tc.name == "wrong type" {
				srv.Do(t, "DEL", warm.Key(req.Zone, req.Key))
				srv.Do(t, "LPUSH", warm.Key(req.Zone, req.Key), "x")
			}
			stores := map[string]*Store{"warm": warm}
			if tc.cold {
				stores["cold"] = newTestStore(t, srv.URL(), "", DefaultTimeout, 2)
			}
			for which, s := range stores {
				// Sequential attempts, then a burst larger than the pool
				// (the pool wait is bounded too).
				for i := range 3 {
					out := make([]algorithms.Decision, 1)
					el, err := timedTake(t, context.Background(), s, []algorithms.Request{req}, out)
					checkFailure(t, which, i, el, err, want)
					if k := kindOf(err); tc.kind != "" && k != tc.kind || k == "" {
						t.Errorf("%s take %d: %v names the kind %q, want %q", which, i, err, k, tc.kind)
					}
					// On a connection that was open, the command went out
					// and no reply came: Redis may have decided it.
					if tc.name == "frozen server" && which == "warm" && !errors.As(err, new(*unknownError)) {
						t.Errorf("warm take %d against a frozen server: %v, want an unknown decision", i, err)
					}
				}
				var wg sync.WaitGroup
				for i := range 10 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						out := make([]algorithms.Decision, 1)
						el, err := timedTake(t, context.Background(), s, []algorithms.Request{req}, out)
						// A burst may also spend its deadline waiting for
						// one of the 2 pooled connections: any error will
						// do, in time.
						checkFailure(t, which+" burst", i, el, err, nil)
					}()
				}
				wg.Wait()
			}
		})
	}
}

func checkFailure(t *testing.T, which string, i int, el time.Duration, err error, want *regexp.Regexp) {
	t.Helper()
	if err == nil {
		t.Errorf("%s take %d: no error", which, i)
		return
	}
	// A decision sent before the timeout waits up to the late-reply grace
	// more for its reply.
	if el > DefaultTimeout+DefaultLateReplyGrace+failMargin {
		t.Errorf("%s take %d: took %v, more than timeout %v + grace %v + %v (error %v)", which, i, el, DefaultTimeout, DefaultLateReplyGrace, failMargin, err)
	}
	if want != nil && !want.MatchString(err.Error()) {
		t.Errorf("%s take %d: error %q, want one matching %s", which, i, err, want)
	}
	// Redis answered: the decision is known (nothing was charged).
	if want != nil && errors.As(err, new(*unknownError)) {
		t.Errorf("%s take %d: Redis's answer %q reported as an unknown decision", which, i, err)
	}
}

// TestMalformedStateIsAFullBucket: an unreadable stored value counts as no
// state (a full bucket), not as an error, and is overwritten with a good one.
func TestMalformedStateIsAFullBucket(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := limit(t, 10, time.Minute, 0)
	// one token of 10 per minute spent, just now
	good := func(raw string) bool {
		st, ok := DecodeState(raw)
		return ok && st.Alg == algorithms.TokenBucket && st.Debt == 60000 && st.Scale == 60000 &&
			st.At > time.Now().Add(-time.Minute).UnixMilli()
	}
	for _, raw := range []string{"garbage", "", "1:2", "1:2:3:4", "a:b:c", "1.5:2:60000", "1:2:0", "-5:1:60000",
		" 1:2:60000", "60000:1:60000\n", "99999999999999999999999:1:60000", "\x00\xff"} {
		req := algorithms.Request{Zone: "bad", Key: freshKey(t), Limit: l, Cost: 1}
		key := s.Key(req.Zone, req.Key)
		srv.Do(t, "SET", key, raw)
		out := make([]algorithms.Decision, 1)
		el, err := timedTake(t, context.Background(), s, []algorithms.Request{req}, out)
		if err != nil {
			t.Errorf("stored %q: Take error %v (%v); want a full bucket", raw, err, el)
			continue
		}
		if d := out[0]; !d.Allowed || d.Remaining != 9 {
			t.Errorf("stored %q: %+v; want allowed, remaining 9 (a full bucket)", raw, d)
		}
		if got := getRaw(t, srv.Client(), key); !good(got) {
			t.Errorf("stored %q: after the Take the key holds %q, want a fresh state", raw, got)
		}
	}
}

// TestCancelledContext: a context that is already done gives an error at
// once and charges nothing.
func TestCancelledContext(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", DefaultTimeout, 0)
	l := limit(t, 10, time.Hour, 0)
	warm := algorithms.Request{Zone: "ctx", Key: freshKey(t), Limit: l, Cost: 1}
	take(t, newTestStore(t, srv.URL(), "", testTimeout, 0), warm)
	out := make([]algorithms.Decision, 1)
	_ = s.Take(context.Background(), []algorithms.Request{warm}, out) // warm the pool

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for name, tc := range map[string]struct {
		ctx  context.Context
		want error
	}{
		"cancelled": {cancelled, context.Canceled},
		"expired":   {expired, context.DeadlineExceeded},
	} {
		req := algorithms.Request{Zone: "ctx", Key: freshKey(t), Limit: l, Cost: 1}
		calls := scriptCalls(t, srv)
		for i := range 5 {
			el, err := timedTake(t, tc.ctx, s, []algorithms.Request{req}, out)
			if !errors.Is(err, tc.want) || el > DefaultTimeout+failMargin {
				t.Errorf("%s context, take %d: error %v after %v; want %v within %v", name, i, err, el, tc.want, DefaultTimeout+failMargin)
			}
		}
		if got := getRaw(t, srv.Client(), s.Key(req.Zone, req.Key)); got != "" {
			t.Errorf("%s context: the key was charged anyway: %q", name, got)
		}
		if n := scriptCalls(t, srv) - calls; n != 0 {
			t.Errorf("%s context: %d script calls reached Redis", name, n)
		}
	}
	// The store still works afterwards.
	if d := take(t, s, algorithms.Request{Zone: "ctx", Key: freshKey(t), Limit: l, Cost: 1})[0]; !d.Allowed {
		t.Fatalf("after cancelled Takes: %+v", d)
	}
}
