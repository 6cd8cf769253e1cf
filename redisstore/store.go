package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// script is the production decision script; its SHA is computed once.
var script = redis.NewScript(algorithms.LuaScript)

// Store decides rate limits in Redis: one Lua script per request (per
// Cluster slot when a request's keys span slots), with the time read from
// Redis itself, under a tight timeout.
type Store struct {
	client  redis.UniversalClient
	cluster bool
	prefix  string
	timeout time.Duration
}

// newStore wraps a client.
func newStore(c redis.UniversalClient, cluster bool, prefix string, timeout time.Duration) *Store {
	return &Store{client: c, cluster: cluster, prefix: prefix, timeout: timeout}
}

// Destruct closes the client: the last user of a pooled store does it.
func (s *Store) Destruct() error { return s.client.Close() }

// Client returns the underlying client (for tests and the admin API).
func (s *Store) Client() redis.UniversalClient { return s.client }

// Key returns the Redis key of one zone's state for one identity:
// <prefix><zone>:{<token>}. The token's text uses only [0-9a-z-] and zone
// names only [A-Za-z0-9_.-], so no client-controlled value can break the
// Cluster hash tag or make one zone's key collide with another's.
func (s *Store) Key(zone string, key algorithms.Key) string {
	var b strings.Builder
	b.Grow(len(s.prefix) + len(zone) + 2*algorithms.KeySize + 8)
	b.WriteString(s.prefix)
	b.WriteString(zone)
	b.WriteString(":{")
	var tok [2*algorithms.KeySize + 8]byte
	b.Write(appendToken(tok[:0], key))
	b.WriteByte('}')
	return b.String()
}

// Take decides reqs in Redis. Either every request is allowed and all are
// charged, or none is charged. Any failure (timeout, connection, NOSCRIPT
// twice, READONLY, OOM, an unexpected reply) is returned as an error for the
// zones' fail policy; the decision never waits longer than the timeout.
func (s *Store) Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
	if len(reqs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	keys := make([]string, len(reqs))
	for i := range reqs {
		keys[i] = s.Key(reqs[i].Zone, reqs[i].Key)
	}
	if !s.cluster || sameSlot(keys) {
		return s.run(ctx, keys, reqs, out, false)
	}
	return s.takeAcrossSlots(ctx, keys, reqs, out)
}

// run evaluates the script once for keys/reqs (all in one slot).
func (s *Store) run(ctx context.Context, keys []string, reqs []algorithms.Request, out []algorithms.Decision, refund bool) error {
	args := make([]any, 0, len(reqs)*algorithms.LuaArgsPerZone)
	for i := range reqs {
		args = algorithms.AppendLuaArgs(args, &reqs[i], refund)
	}
	res, err := script.Run(ctx, s.client, keys, args...).Int64Slice()
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return errors.New("redis: the script returned nil")
		}
		return err
	}
	if refund {
		return nil
	}
	if len(res) != 4*len(reqs) {
		return fmt.Errorf("redis: the script returned %d values for %d zones", len(res), len(reqs))
	}
	for i := range reqs {
		v := res[4*i : 4*i+4]
		out[i] = algorithms.Decision{
			Allowed:    v[0] == 1,
			Limit:      reqs[i].Limit.Capacity(),
			Remaining:  v[1],
			RetryAfter: time.Duration(v[2]) * time.Millisecond,
			ResetAfter: time.Duration(v[3]) * time.Millisecond,
		}
	}
	return nil
}

// takeAcrossSlots decides a request whose keys live in several Cluster slots:
// one script per slot, in order; when a later slot refuses, the slots already
// charged are refunded. Between a charge and its refund (one round trip) a
// concurrent request may see those zones charged: the only window in which a
// multi-zone decision is not atomic.
func (s *Store) takeAcrossSlots(ctx context.Context, keys []string, reqs []algorithms.Request, out []algorithms.Decision) error {
	// out may hold a previous request's decisions (callers reuse it), and
	// zones in slots never reached must not report them.
	clear(out[:len(reqs)])
	groups := map[uint16][]int{}
	var order []uint16
	for i, k := range keys {
		sl := slot(hashTag(k))
		if _, ok := groups[sl]; !ok {
			order = append(order, sl)
		}
		groups[sl] = append(groups[sl], i)
	}
	var charged [][]int
	refused := false
	for _, sl := range order {
		idx := groups[sl]
		gk, gr := subset(keys, reqs, idx)
		gout := make([]algorithms.Decision, len(idx))
		if err := s.run(ctx, gk, gr, gout, false); err != nil {
			s.refund(keys, reqs, charged)
			return err
		}
		ok := true
		for j, i := range idx {
			out[i] = gout[j]
			ok = ok && (gout[j].Allowed || gr[j].ReportOnly)
		}
		if !ok {
			refused = true
			break
		}
		// Only the zones that allowed were charged (a report-only zone that
		// would refuse was not).
		var got []int
		for _, i := range idx {
			if out[i].Allowed {
				got = append(got, i)
			}
		}
		if len(got) > 0 {
			charged = append(charged, got)
		}
	}
	if refused {
		s.refund(keys, reqs, charged)
		// The zones charged and refunded report what they had before.
		for _, idx := range charged {
			for _, i := range idx {
				out[i].Remaining += reqs[i].Cost
			}
		}
		// Zones of slots never reached are reported as allowed with no
		// numbers; the refusal comes from another zone.
		for _, sl := range order {
			for _, i := range groups[sl] {
				if out[i].Limit == 0 {
					out[i] = algorithms.Decision{Allowed: true, Limit: reqs[i].Limit.Capacity(), Remaining: reqs[i].Limit.Capacity()}
				}
			}
		}
	}
	return nil
}

// refund gives back what the groups in charged were charged. It runs on its
// own short deadline so that a refused request's refund is not lost to the
// request's expired one.
func (s *Store) refund(keys []string, reqs []algorithms.Request, charged [][]int) {
	if len(charged) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	for _, idx := range charged {
		gk, gr := subset(keys, reqs, idx)
		_ = s.run(ctx, gk, gr, nil, true)
	}
}

func subset(keys []string, reqs []algorithms.Request, idx []int) ([]string, []algorithms.Request) {
	gk := make([]string, len(idx))
	gr := make([]algorithms.Request, len(idx))
	for j, i := range idx {
		gk[j], gr[j] = keys[i], reqs[i]
	}
	return gk, gr
}

// hashTag returns the hash tag of one of our keys.
func hashTag(k string) []byte {
	open := strings.IndexByte(k, '{')
	end := strings.IndexByte(k[open+1:], '}')
	return []byte(k[open+1 : open+1+end])
}

func sameSlot(keys []string) bool {
	first := slot(hashTag(keys[0]))
	for _, k := range keys[1:] {
		if slot(hashTag(k)) != first {
			return false
		}
	}
	return true
}

// appendToken appends a key's text form. It is the identity token's text
// (see identity.Token.AppendText), rendered here without importing it.
func appendToken(b []byte, k algorithms.Key) []byte {
	const hexdigits = "0123456789abcdef"
	b = append(b, k[1])
	b = appendUint(b, uint64(k[0]))
	b = append(b, '-')
	payload := k[2:]
	switch k[1] {
	case 'e':
		payload = nil
	case '4':
		payload = k[2:6]
	}
	for _, c := range payload {
		b = append(b, hexdigits[c>>4], hexdigits[c&0xf])
	}
	return b
}

func appendUint(b []byte, v uint64) []byte {
	if v >= 10 {
		b = appendUint(b, v/10)
	}
	return append(b, byte('0'+v%10))
}
