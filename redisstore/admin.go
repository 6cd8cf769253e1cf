package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// This file serves the admin API (admin.api.rate_limit): read a key's state
// without charging it, and reset it.

// minAdminTimeout is the least an admin call is given: the decision timeout
// is tuned for the hot path (a few ms), an operator's call can wait longer.
// (The client's own read and write timeouts, the decision timeout, still
// bound each command.)
const minAdminTimeout = time.Second

// PeekKeys reads the state of several keys of one zone without charging
// them and without running the decision script: in one pipeline per node,
// Redis's TIME (the clock the script uses) and a GET of each key; the
// stored values are decoded (DecodeState) and viewed with the Go
// twin of the script (algorithms.Peek). out and found, sized by the caller
// to len(keys), get each key's view and whether it holds state (state back
// to full, or written by another algorithm, counts as none).
func (s *Store) PeekKeys(ctx context.Context, zone string, keys []algorithms.Key, l algorithms.Limit, out []algorithms.Decision, found []bool) error {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, minAdminTimeout))
	defer cancel()
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = s.zoneKey(zone, k, l.Algorithm)
	}
	defer s.peekSynced(zone, keys, l, out, found)
	peek := peekOn
	if _, ok := s.syncCfg(zone); ok && algorithms.Syncable(l.Algorithm) {
		peek = peekCounts // the mode keeps counts per window (async.go)
	}
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return peek(ctx, s.client, names, l, out, found)
	}
	// Each key's hash tag is its token, so the keys of one client's
	// candidates live in different hash slots: ask each key's master, with its
	// own clock, as the script would run there.
	for i, name := range names {
		node, err := cc.MasterForKey(ctx, name)
		if err != nil {
			return err
		}
		if err := peek(ctx, node, names[i:i+1], l, out[i:i+1], found[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// peekOn peeks names on one server.
func peekOn(ctx context.Context, c redis.Cmdable, names []string, l algorithms.Limit, out []algorithms.Decision, found []bool) error {
	if l.Algorithm == algorithms.Concurrency {
		return peekSlots(ctx, c, names, l, out, found) // concurrency.go
	}
	pipe := c.Pipeline()
	now := pipe.Time(ctx)
	gets := make([]*redis.StringCmd, len(names))
	ovs := make([]*redis.StringCmd, len(names))
	for i, n := range names {
		gets[i] = pipe.Get(ctx, n)
		ovs[i] = pipe.Get(ctx, n+":o") // its override (override.go)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	t, err := now.Result()
	if err != nil {
		return err
	}
	// As the script: seconds × 1000 + ⌊microseconds / 1000⌋.
	ms := t.UnixMilli()
	for i, g := range gets {
		raw, err := g.Result()
		if errors.Is(err, redis.Nil) {
			raw, err = "", nil
		}
		if err != nil {
			return err
		}
		st, ok := DecodeState(raw)
		if o, on := decodeOverride(ovs[i].Val()); on && o.Expires > ms {
			out[i] = algorithms.PeekOverride(&o, st, !ok, l, ms)
			found[i] = ok && out[i].ResetAfter > 0 || o.Block
			continue
		}
		out[i] = algorithms.Peek(st, !ok, l, ms)
		found[i] = ok && out[i].ResetAfter > 0
	}
	return nil
}

// ResetKeys deletes the state of several keys of one zone (one DEL per
// key, pipelined: in a Cluster they live in different hash slots) and returns
// how many existed. It then increments the resets counter every store
// sharing the Redis polls (watch.go), so that the key's refusals cached by
// any instance end within a poll: in the same pipeline on one server (the
// DELs run first), after the DELs in a Cluster (where the counter's master
// may be another one's, and the pipeline's parts run in parallel).
func (s *Store) ResetKeys(ctx context.Context, zone string, keys []algorithms.Key) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, minAdminTimeout))
	defer cancel()
	pipe := s.client.Pipeline()
	dels := make([][]*redis.IntCmd, len(keys))
	cfg, synced := s.syncCfg(zone)
	for i, k := range keys {
		name := s.Key(zone, k)
		// A concurrency zone's slots (concurrency.go): the admin API does
		// not say which kind the zone is, and a key holds one or the other.
		dels[i] = append(dels[i], pipe.Del(ctx, name), pipe.Del(ctx, s.SlotsKey(zone, k)))
		if synced {
			// The mode's counts (async.go): the windows around this
			// instance's clock.
			w := cfg.limit.Window
			ws := algorithms.WindowStart(time.Now().UnixMilli(), w)
			for _, start := range []int64{ws - w, ws, ws + w} {
				dels[i] = append(dels[i], pipe.Del(ctx, countKey(name, start)))
			}
		}
	}
	if !s.cluster {
		pipe.Incr(ctx, s.resetsKey())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	if s.cluster {
		if err := s.client.Incr(ctx, s.resetsKey()).Err(); err != nil {
			return 0, fmt.Errorf("the keys were deleted, but the other instances could not be told (%w): their deny caches may refuse the client until their refusals end; reset again", err)
		}
	}
	for _, k := range keys {
		s.deny.Forget(zone, k) // this instance's refusals of the key end at once
	}
	s.forgetSynced(zone, keys) // and its view in the asynchronous mode
	n := 0
	for _, ds := range dels {
		for _, d := range ds {
			if d.Val() > 0 {
				n++
				break
			}
		}
	}
	return n, nil
}

// PeekKeys implements the admin API's read (see Store.PeekKeys).
func (r *Redis) PeekKeys(ctx context.Context, zone string, keys []algorithms.Key, l algorithms.Limit, out []algorithms.Decision, found []bool) error {
	if r.Store == nil {
		return errors.New("store redis: not provisioned")
	}
	return r.Store.PeekKeys(ctx, zone, keys, l, out, found)
}

// ResetKeys implements the admin API's reset (see Store.ResetKeys).
func (r *Redis) ResetKeys(ctx context.Context, zone string, keys []algorithms.Key) (int, error) {
	if r.Store == nil {
		return 0, errors.New("store redis: not provisioned")
	}
	return r.Store.ResetKeys(ctx, zone, keys)
}

// AdminInfo describes the store for the admin API's zone listing: the
// target (scheme and host, or the Cluster seeds), never a credential.
func (r *Redis) AdminInfo() map[string]any {
	repl := caddy.NewReplacer()
	cfg := connConfig{URL: repl.ReplaceAll(r.URL, ""), Cluster: r.Cluster}
	info := map[string]any{
		"module":     "redis",
		"target":     cfg.describe(),
		"key_prefix": r.KeyPrefix,
		"key_schema": r.KeyPrefix + "<zone, percent-encoded outside [A-Za-z0-9_.-]>:{<token>}",
		"timeout":    time.Duration(r.Timeout).String(),
	}
	if len(r.Cluster) > 0 {
		info["tls"] = r.TLS
	}
	if r.PoolSize > 0 {
		info["pool_size"] = r.PoolSize
	}
	if r.Store != nil {
		info["circuit"] = r.Store.CircuitState()
		info["nodes"] = r.Store.Nodes()
		info["deny_cache_size"] = r.Store.deny.Cap()
		if p := r.Store.Problem(); p != "" {
			info["problem"] = p
		}
	}
	return info
}

// PeekInFlight writes each key's units charged in flight (Request.InFlight:
// the counter beside its state that take.lua keeps) to out, sized by the
// caller to len(keys), in one pipeline.
func (s *Store) PeekInFlight(ctx context.Context, zone string, keys []algorithms.Key, l algorithms.Limit, out []int64) error {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, minAdminTimeout))
	defer cancel()
	pipe := s.client.Pipeline()
	gets := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, s.zoneKey(zone, k, l.Algorithm)+":f")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	for i, g := range gets {
		n, err := g.Int64()
		if errors.Is(err, redis.Nil) {
			n, err = 0, nil
		}
		if err != nil {
			return err
		}
		out[i] = max(n, 0)
	}
	return nil
}

// PeekInFlight implements the admin API's in-flight read (see
// Store.PeekInFlight).
func (r *Redis) PeekInFlight(ctx context.Context, zone string, keys []algorithms.Key, l algorithms.Limit, out []int64) error {
	if r.Store == nil {
		return errors.New("store redis: not provisioned")
	}
	return r.Store.PeekInFlight(ctx, zone, keys, l, out)
}
