package redisstore

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestSentinelKillResumesAtPromotion: kill -9 of the master opens the
// breaker (its cool-down 1 s, then 2 s); the sentinels promote the replica
// about a second later, and the store, told of it by its promotion guard,
// probes at once instead of waiting out the cool-down: decisions resume
// within about a decision's timeout of the promotion (seen here by polling
// the replica's ROLE), far below the 1 s cool-down the breaker would
// otherwise hold them back for.
func TestSentinelKillResumesAtPromotion(t *testing.T) {
	ss := redistest.StartSentinel(t)
	m := sentinelStore(t, ss, ss.SentinelAddr)
	s := m.Store
	take(t, s, algorithms.Request{Zone: "load", Key: freshKey(t), Limit: limit(t, 1e9, time.Hour, 0), Cost: 1})
	load := &shardLoad{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	load.run(t, s, freshKey(t), 4, stop, &wg)
	defer func() { close(stop); wg.Wait() }()

	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	ss.Master.Kill()
	var promoted time.Time
	deadline := t0.Add(30 * time.Second)
	for promoted.IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("the replica was not promoted within 30s of the kill")
		}
		if v, err := ss.Replica.DoErr("ROLE"); err == nil {
			if role, _ := v.([]any); len(role) > 0 && role[0] == "master" {
				promoted = time.Now()
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	var firstOK time.Time
	for firstOK.IsZero() {
		if time.Now().After(deadline) {
			t.Fatalf("no decision succeeded within 30s of the kill (breaker %s)", s.CircuitState())
		}
		time.Sleep(5 * time.Millisecond)
		_, _, _, firstOK = load.since(t0, promoted)
	}
	t.Logf("promoted %v after the kill", promoted.Sub(t0).Round(time.Millisecond))
	resumed := firstOK.Sub(promoted)
	t.Logf("decisions resumed %v after the promotion", resumed)
	// The breaker's cool-down is 1 s, then 2 s: waiting it out costs more
	// than this bound; a probe at the promotion costs about a timeout.
	if resumed > 700*time.Millisecond {
		t.Errorf("decisions resumed %v after the promotion, want < 700ms (a probe at once, not the breaker's cool-down)", resumed)
	}
}

// TestBreakerProbeNow: probeNow ends an open circuit's cool-down (an hour
// here) at once; told during a probe, the probe's failure reopens the
// circuit with no cool-down, once; closed, it changes nothing.
func TestBreakerProbeNow(t *testing.T) {
	b := newBreaker(1, time.Hour, time.Hour)
	cause := errors.New("dial: connection refused")
	b.probeNow()
	if probe, err := b.allow(); probe || err != nil {
		t.Fatalf("closed, after probeNow: allow = %v, %v; want a plain call", probe, err)
	}
	b.done(false, true, false, cause)
	if _, err := b.allow(); err == nil {
		t.Fatal("open within its cool-down: allow let a call through")
	}
	b.probeNow()
	probe, err := b.allow()
	if !probe || err != nil {
		t.Fatalf("open, after probeNow: allow = %v, %v; want the probe", probe, err)
	}
	b.probeNow() // the promotion seen while the probe is in flight
	b.done(true, true, false, cause)
	if probe, err := b.allow(); !probe || err != nil {
		t.Fatalf("a probe failed after probeNow: allow = %v, %v; want another probe at once", probe, err)
	}
	b.done(true, true, false, cause)
	if _, err := b.allow(); err == nil {
		t.Fatal("a second failed probe without probeNow: allow let a call through within the cool-down")
	}
	b.probeNow()
	probe, _ = b.allow()
	b.done(probe, false, false, nil)
	if st := b.State(); st != "closed" {
		t.Fatalf("a probe that succeeded: state %s, want closed", st)
	}
}
