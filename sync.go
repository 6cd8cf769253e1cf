package sluice

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/caddy-sluice/admin"
	"github.com/sluicehq/caddy-sluice/stores"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// syncControl: a zone in the asynchronous mode (`sync <interval>`). The
// store decides the zone's keys on this instance from their counts as last
// read plus the instance's charges since, and syncs them every interval
// (redisstore/async.go); the handler only registers the zone with the
// store and shows the mode in the admin view. docs/redis.md, "The
// asynchronous mode".
var syncControl = control{
	name: "sync",
	compile: func(z *zone, cfg *Zone) error {
		z.sync.cfg = cfg.Sync
		return nil
	},
	provision: provisionSync,
	cleanup: func(h *Handler) {
		for _, z := range h.zones {
			if z.sync.release != nil {
				z.sync.release()
				z.sync.release = nil
			}
		}
	},
	admin: adminSync,
}

// syncZone is a zone's asynchronous mode: its settings, and the store
// that runs it once registered.
type syncZone struct {
	cfg     *zonemodel.Sync // nil: exact
	store   stores.Syncer
	release func()
}

// provisionSync registers the directive's zones in the mode with the
// store; it joins no stage (the store decides them).
func provisionSync(h *Handler) (stages, error) {
	for _, z := range h.zones {
		if z.sync.cfg == nil {
			continue
		}
		sy, ok := h.store.(stores.Syncer)
		if !ok {
			return 0, zoneErr(z.name, errors.New("sync needs a shared store that syncs (store redis { url ... }); the memory store decides every request here already"))
		}
		release, err := sy.SyncZone(z.name, z.limit, time.Duration(z.sync.cfg.Interval), z.sync.cfg.Keys())
		if err != nil {
			return 0, zoneErr(z.name, err)
		}
		z.sync.store, z.sync.release = sy, release
	}
	return 0, nil
}

// adminSync adds the mode, its bound and this instance's sync to a zone's
// listing.
func adminSync(z *zone, info *adminZoneInfo) {
	if z.sync.store == nil {
		return
	}
	st, ok := z.sync.store.SyncStatus(z.name)
	if !ok {
		return
	}
	n := z.limit.Events
	s := &admin.Sync{Interval: st.Interval.String(), Keys: st.Keys, MaxKeys: st.MaxKeys, LagMs: -1,
		Failures: st.Failures, Held: st.Held, Dropped: st.Dropped, Error: st.Error,
		Bound: fmt.Sprintf("per key and window, at most %d + (I-1) x (%d - G) with I instances, once each has read the count G (a sync, every %s); exact for a key one instance uses", n, n, st.Interval)}
	if !st.LastSync.IsZero() {
		s.LagMs = time.Since(st.LastSync).Milliseconds()
	}
	info.Sync = s
}
