package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// pipeCounter is a go-redis hook counting the pipelines that carry script
// calls and those calls (not a new connection's handshake, which go-redis
// also sends as a pipeline).
type pipeCounter struct{ pipes, cmds atomic.Int64 }

func (*pipeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (*pipeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (p *pipeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := int64(0)
		for _, c := range cmds {
			if name := c.Name(); name == "fcall" || name == "evalsha" || name == "eval" {
				n++
			}
		}
		if n > 0 {
			p.pipes.Add(1)
			p.cmds.Add(n)
		}
		return next(ctx, cmds)
	}
}

// TestPipeliningSharesRoundTrips: concurrent decisions travel together
// (fewer pipelines than calls), each is still its own script evaluation
// (one EVALSHA per Take in Redis's command stats), and the counts stay
// exact: 40 goroutines × 10 Takes on one key of limit 137 → exactly 137
// allowed.
func TestPipeliningSharesRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	var pc pipeCounter
	s.Client().AddHook(&pc)
	l := limit(t, 137, time.Hour, 0)
	req := algorithms.Request{Zone: "pipe", Key: freshKey(t), Limit: l, Cost: 1}
	take(t, s, algorithms.Request{Zone: "pipe-warm", Key: freshKey(t), Limit: l, Cost: 1}) // loads the script
	before := scriptCalls(t, srv)
	pc.pipes.Store(0)
	pc.cmds.Store(0)

	const goroutines, each = 40, 10
	var allowed, refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out := make([]algorithms.Decision, 1)
			for range each {
				if err := s.Take(context.Background(), []algorithms.Request{req}, out); err != nil {
					t.Errorf("Take: %v", err)
					return
				}
				if out[0].Allowed {
					allowed.Add(1)
				} else {
					refused.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	calls := scriptCalls(t, srv) - before
	t.Logf("%d Takes: %d allowed, %d refused; %d script calls in %d pipelines (%.1f calls per round trip)",
		goroutines*each, allowed.Load(), refused.Load(), pc.cmds.Load(), pc.pipes.Load(), float64(pc.cmds.Load())/float64(max(pc.pipes.Load(), 1)))
	if allowed.Load() != 137 || refused.Load() != goroutines*each-137 {
		t.Errorf("allowed %d, refused %d; want exactly 137 and %d", allowed.Load(), refused.Load(), goroutines*each-137)
	}
	if calls != goroutines*each || pc.cmds.Load() != goroutines*each {
		t.Errorf("Redis ran %d scripts and the client sent %d for %d Takes; want one per Take", calls, pc.cmds.Load(), goroutines*each)
	}
	if pc.pipes.Load() >= pc.cmds.Load() {
		t.Errorf("%d pipelines for %d calls: concurrent calls did not share round trips", pc.pipes.Load(), pc.cmds.Load())
	}
}

// TestPipelineDeadlines: with Redis frozen and one pipeline worker, 60
// concurrent Takes (the first batch stuck in the worker's round trip, the
// rest queued behind it, then sent by a spare) all fail within the timeout
// plus the late-reply grace plus the margin; the ones sent fail as unknown
// decisions, any that waited out their deadline in the queue as not sent
// (each counted). After a thaw Redis runs exactly the scripts of the
// unknown decisions (nothing counted unsent reached it), and the same
// store decides again.
func TestPipelineDeadlines(t *testing.T) {
	srv := redistest.Start(t)
	cfg := connConfig{URL: srv.URL(), Timeout: DefaultTimeout, Prefix: DefaultKeyPrefix, PoolSize: 1, Grace: DefaultLateReplyGrace}
	c, _, err := cfg.newClient()
	if err != nil {
		t.Fatal(err)
	}
	o := redisPathOptions()
	o.Failures, o.Workers = 0, 1 // no breaker: every Take reaches the queue
	s := newStoreWith(c, false, DefaultKeyPrefix, DefaultTimeout, o)
	t.Cleanup(func() { _ = s.Destruct() })
	l := limit(t, 1000, time.Hour, 0)
	req := algorithms.Request{Zone: "deadline", Key: freshKey(t), Limit: l, Cost: 1}
	take(t, s, req)

	before := scriptCalls(t, srv)
	unknownBefore, notSentBefore := testutil.ToFloat64(s.unknown), testutil.ToFloat64(s.notSent)
	srv.Freeze(t)
	var wg sync.WaitGroup
	var late, ok, unknown, notSent atomic.Int64
	for range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Decision, 1)
			el, err := timedTake(t, context.Background(), s, []algorithms.Request{req}, out)
			switch {
			case errors.As(err, new(*unknownError)):
				unknown.Add(1)
			case errors.Is(err, errNotSent):
				notSent.Add(1)
			}
			switch {
			case err == nil:
				ok.Add(1)
			case el > DefaultTimeout+DefaultLateReplyGrace+failMargin:
				late.Add(1)
				t.Errorf("a queued Take failed after %v (timeout %v + grace %v + margin %v): %v", el, DefaultTimeout, DefaultLateReplyGrace, failMargin, err)
			}
		}()
	}
	wg.Wait()
	srv.Thaw(t)
	if ok.Load() != 0 {
		t.Errorf("%d Takes succeeded against a frozen Redis", ok.Load())
	}
	if n := unknown.Load(); n < 1 {
		t.Errorf("%d of 60 Takes failed as unknown decisions; want at least the first batch's", n)
	}
	if unknown.Load()+notSent.Load() != 60 {
		t.Errorf("%d unknown and %d not sent of 60 failed Takes; want every one either", unknown.Load(), notSent.Load())
	}
	if got := testutil.ToFloat64(s.unknown) - unknownBefore; got != float64(unknown.Load()) {
		t.Errorf("unknown decisions counted: %v, want %d", got, unknown.Load())
	}
	if got := testutil.ToFloat64(s.notSent) - notSentBefore; got != float64(notSent.Load()) {
		t.Errorf("unsent timeouts counted: %v, want %d", got, notSent.Load())
	}
	// The thawed server runs what it had received: the sent calls, and
	// only those.
	var ran int64
	for wait := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ran = scriptCalls(t, srv) - before; ran >= unknown.Load() || time.Now().After(wait) {
			break
		}
	}
	if ran != unknown.Load() {
		t.Errorf("Redis ran %d scripts after the thaw; want the %d sent (unknown) ones, no queued one", ran, unknown.Load())
	}
	// Once thawed, the store decides again (the frozen round trip's
	// connection was dropped by its deadline).
	deadline := time.Now().Add(5 * time.Second)
	for {
		out := make([]algorithms.Decision, 1)
		if err := s.Take(context.Background(), []algorithms.Request{req}, out); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no decision 5s after the thaw: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestArgsCacheKeepsTheLayout: a zone's argument (lua/take.lua,
// script.go) joins, in order, the spec (algorithm id, events, window,
// capacity, the options), cost, mode and the charge's instant (a
// refund's); for random limits (colliding in the cache), penalties, delays,
// costs and modes.
func TestArgsCacheKeepsTheLayout(t *testing.T) {
	var a argCache
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		alg := algorithms.Algorithm(rng.IntN(5))
		l := algorithms.Limit{Algorithm: alg, Events: 1 + rng.Int64N(1000), Window: 1 + rng.Int64N(100000)}
		if alg.AllowsBurst() && rng.IntN(2) == 0 {
			l.Burst = rng.Int64N(2000)
		}
		if rng.IntN(3) == 0 {
			l.Penalty = 1 + rng.Int64N(1e6)
		}
		if alg.AllowsBurst() && rng.IntN(3) == 0 {
			l.Delay = 1 + rng.Int64N(1e4)
			if rng.IntN(2) == 0 {
				l.DelayAfter = 1 + rng.Int64N(l.Capacity())
			}
		}
		r := algorithms.Request{Zone: "z", Limit: l, Cost: 1 + rng.Int64N(500), ReportOnly: rng.IntN(3) == 0, Refundable: rng.IntN(3) == 0, NoDelay: rng.IntN(3) == 0}
		refund := rng.IntN(4) == 0
		mode := "0"
		switch {
		case refund:
			mode = "1"
		case r.ReportOnly && r.Refundable:
			mode = "4"
		case r.ReportOnly:
			mode = "2"
		case r.Refundable:
			mode = "3"
		}
		opts := ""
		if l.Penalty > 0 {
			opts += fmt.Sprintf("p%d", l.Penalty)
		}
		if l.Delay > 0 {
			opts += fmt.Sprintf("d%d", l.Delay)
			if l.DelayAfter > 0 {
				opts += fmt.Sprintf("a%d", l.DelayAfter)
			}
		}
		base := opts
		if opts == "" {
			opts, base = "0", "0"
		}
		if l.Delay > 0 && r.NoDelay {
			opts += "n1"
		}
		got := string(a.appendTake(nil, &r, refund))
		want := fmt.Sprintf("%d:%d:%d:%d:%s,%d,%s,0", alg, l.Events, l.Window, l.Capacity(), opts, r.Cost, mode)
		if got != want {
			t.Fatalf("step %d, %+v refund %v: args %s, want %s", i, r, refund, got, want)
		}
		at := rng.Int64N(1 << 42)
		got = string(a.appendRefund(nil, &algorithms.Refund{Limit: l, Cost: r.Cost, At: at}))
		want = fmt.Sprintf("%d:%d:%d:%d:%s,%d,1,%d", alg, l.Events, l.Window, l.Capacity(), base, r.Cost, at)
		if got != want {
			t.Fatalf("step %d, refund of %+v at %d: args %s, want %s", i, r, at, got, want)
		}
	}
}
