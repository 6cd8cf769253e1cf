package redisstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Evictions and restarts reset limits: an evicted key, or a server
// restarted empty, starts its client over with a full limit. Neither is an
// error Redis reports, so the store reads the eviction policy at load and
// then every policyEvery polls of the watch, and the watch tells restarts
// (run_id) and evictions (evicted_keys) from its polls (noteChanges):
// counted, and logged (evictions at most once per evictWarnEvery).
// docs/redis.md, "Redis settings Sluice needs", states the bounds.

const (
	// policyEvery is how many polls of the watch pass between two reads
	// of the eviction policy (a minute).
	policyEvery = int(time.Minute / watchInterval)
	// evictWarnEvery spaces the warnings of evictions.
	evictWarnEvery = time.Minute
)

// evictWatch is the watch's view of the eviction policy and evictions.
type evictWatch struct {
	polls    int
	policies string // the policies last read, "" before the first read
	warnAt   time.Time
	pending  int64 // evictions not yet logged
}

// policyOf reads one server's maxmemory-policy and maxmemory.
func policyOf(ctx context.Context, c redis.Cmdable) (policy, maxmemory string, err error) {
	m, err := c.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return "", "", err
	}
	return m["maxmemory-policy"], m["maxmemory"], nil
}

// evicts reports whether a maxmemory-policy may evict Sluice's keys: all
// but noeviction (every key Sluice writes has a TTL, so the volatile-*
// policies choose among them too).
func evicts(policy string) bool { return policy != "" && policy != "noeviction" }

// policies reads the eviction policy of every master ("policy (maxmemory
// N)", joined by ", " in a Cluster) and whether one may evict Sluice's
// keys.
func (s *Store) policies(ctx context.Context) (desc string, evicting bool, err error) {
	var mu sync.Mutex
	var parts []string
	one := func(ctx context.Context, c redis.Cmdable) error {
		p, mm, err := policyOf(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		evicting = evicting || evicts(p)
		parts = append(parts, p+" (maxmemory "+mm+")")
		return nil
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return one(ctx, c) })
	} else {
		err = one(ctx, s.client)
	}
	return strings.Join(parts, ", "), evicting, err
}

// checkEviction reads the eviction policy at load and logs a policy that
// may evict Sluice's keys; a policy that cannot be read (CONFIG denied by
// ACL, or renamed, as managed services do) is said, not an error.
func (s *Store) checkEviction(ctx context.Context) {
	desc, evicting, err := s.policies(ctx)
	s.logPolicy(desc, evicting, err)
}

func (s *Store) logPolicy(desc string, evicting bool, err error) {
	log := s.opts.Logger
	if log == nil {
		return
	}
	switch {
	case err != nil && (isNoPerm(err) || strings.HasPrefix(err.Error(), "ERR unknown command")):
		log.Info("redis's eviction policy could not be read (CONFIG GET denied or renamed); evictions are still counted from INFO",
			zap.String("target", s.opts.Target), zap.Error(err))
	case err != nil:
		log.Debug("redis's eviction policy could not be read", zap.String("target", s.opts.Target), zap.Error(err))
	case evicting:
		log.Warn("redis may evict Sluice's keys under memory pressure: an evicted key gives its client up to one full limit again; "+
			"give Sluice a Redis (or database) of its own with maxmemory-policy noeviction (docs/redis.md, \"Redis settings Sluice needs\")",
			zap.String("target", s.opts.Target), zap.String("maxmemory_policy", desc))
	}
}

// poll rereads the policy every policyEvery polls, and logs one that
// changed to a policy that evicts.
func (e *evictWatch) poll(ctx context.Context, w *watcher) {
	e.polls++
	if e.polls%policyEvery != 1 {
		return
	}
	desc, evicting, err := w.s.policies(ctx)
	if err != nil || desc == e.policies {
		return
	}
	if e.policies != "" && evicting {
		w.s.logPolicy(desc, evicting, nil)
	}
	e.policies = desc
}

// noteChanges compares the poll that just succeeded (nextFacts) with the
// previous one: a changed run_id is a restart (or a failover), counted and
// logged, with whether the data survived it (the canary kept); a rise of
// evicted_keys is counted, and logged at most once per evictWarnEvery.
func (w *watcher) noteChanges() {
	target := w.s.opts.Target
	for tag, f := range w.nextFacts {
		p, ok := w.facts[tag]
		if !ok || p.runID == "" || f.runID == "" {
			continue
		}
		if p.runID != f.runID {
			data := "kept"
			if p.epoch != f.epoch {
				data = "lost"
			}
			storeMetrics.restarts.WithLabelValues("redis", target, data).Inc()
			if data == "lost" {
				w.logger.Warn("redis restarted empty (its run_id changed and its data is gone): every key's limit started afresh, "+
					"so each client may have been admitted up to one more full limit (persistence avoids it: docs/redis.md)",
					zap.String("target", target), zap.String("canary", tag), zap.String("run_id", f.runID))
			} else {
				w.logger.Warn("redis restarted or failed over with its data (its run_id changed, the store's canary kept)",
					zap.String("target", target), zap.String("canary", tag), zap.String("run_id", f.runID))
			}
			continue
		}
		before, err1 := strconv.ParseInt(p.evicted, 10, 64)
		now, err2 := strconv.ParseInt(f.evicted, 10, 64)
		if err1 != nil || err2 != nil || now <= before {
			continue
		}
		storeMetrics.evictedKeys.WithLabelValues("redis", target).Add(float64(now - before))
		w.evict.pending += now - before
	}
	if w.evict.pending > 0 && time.Since(w.evict.warnAt) >= evictWarnEvery {
		w.logger.Warn("redis evicted keys for memory: each evicted Sluice key gives its client up to one full limit again; "+
			"give Sluice a Redis (or database) of its own with maxmemory-policy noeviction (docs/redis.md, \"Redis settings Sluice needs\")",
			zap.String("target", target), zap.Int64("evicted_keys", w.evict.pending), zap.String("maxmemory_policy", w.evict.policies))
		w.evict.pending, w.evict.warnAt = 0, time.Now()
	}
}
