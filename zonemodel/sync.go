package zonemodel

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Sync is a zone's asynchronous mode (Zone.Sync).
type Sync struct {
	// Interval is how often each instance sends its charges of the zone's
	// keys to the shared store and reads their counts back. 10ms to 1m.
	// Required (Caddyfile: sync <interval>).
	Interval caddy.Duration `json:"interval,omitempty"`

	// MaxKeys bounds the keys of the zone one instance keeps (their
	// counts as last read and their charges not yet sent, about 300 bytes
	// each); past it the least recently requested of a sample of 8 is
	// dropped, its unsent charges counted dropped. 1 to 10,000,000.
	// Default: 100,000.
	MaxKeys int `json:"max_keys,omitempty"`
}

// Bounds of Sync.
const (
	MinSyncInterval = 10 * time.Millisecond
	MaxSyncInterval = time.Minute
	DefaultSyncKeys = 100_000
	MaxSyncKeys     = 10_000_000
)

// Keys returns MaxKeys, or its default.
func (s *Sync) Keys() int {
	if s.MaxKeys == 0 {
		return DefaultSyncKeys
	}
	return s.MaxKeys
}

// checkSync checks sync's values and what it combines with: the
// algorithms whose counts add later (algorithms.Syncable), and none of
// the settings that need every request of a key decided by the store
// itself.
func (z *Zone) checkSync(alg algorithms.Algorithm) error {
	s := z.Sync
	if s == nil {
		return nil
	}
	if d := time.Duration(s.Interval); d < MinSyncInterval || d > MaxSyncInterval {
		return fmt.Errorf("sync: the interval must be between %s and %s, got %s", MinSyncInterval, MaxSyncInterval, d)
	}
	if s.MaxKeys < 0 || s.MaxKeys > MaxSyncKeys {
		return fmt.Errorf("sync: max_keys must be between 1 and %d, got %d", MaxSyncKeys, s.MaxKeys)
	}
	for _, c := range []struct {
		set  bool
		name string
	}{{z.IsConcurrency(), "concurrent"}, {len(z.Count) > 0, "count"}, {z.Settle != nil, "settle"}, {z.Penalty > 0, "penalty"},
		{z.Delay > 0, "delay"}, {z.LocalAllowance != nil, "local_allowance"}, {z.MaxOverrides > 0, "max_overrides"}} {
		if c.set {
			return fmt.Errorf("sync: not with %s (it needs every request of the key decided, given back or settled by the store itself; keep the zone exact)", c.name)
		}
	}
	if !algorithms.Syncable(alg) {
		why := "a bucket refills between a request and the sync that adds its charge, so the charge cannot be placed where it fell"
		if alg == algorithms.SlidingLog {
			why = "the log needs every charge's instant, one entry per request sent"
		}
		return fmt.Errorf("sync: not with %s (%s); use fixed_window or sliding_window, whose counts add exactly in their windows, or keep the zone exact", alg, why)
	}
	if z.MaxEventsFrom != "" || z.WindowFrom != "" || z.BurstFrom != "" {
		return errors.New("sync: not with a limit chosen per request (max_events_from, window_from, burst_from): a key's counts are kept under one limit")
	}
	return nil
}
