package redisstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/zonename"
	"github.com/sluicehq/caddy-sluice/stores"
)

// Overrides (stores.Overrider). A key's override lives beside its state,
// under the same hash tag, at <state key>:o, where the decision's script
// reads it (lua/take.lua; encodeOverride), with a PXAT of its expiry. Each zone's index, for the listing and its bound,
// is a sorted set of tokens by expiry and a hash of their audit (JSON), at
// <prefix>ctl:{ovr:<zone>}:exp and :meta; a small script keeps them, and
// hands each ended override to the one caller that removes it.

// overrideIndex keeps a zone's index: it removes the overrides ended by
// ARGV[1] (ms) and returns their audits; then, given a token (ARGV[2]),
// with ARGV[3] '+' it adds it (expiry ARGV[4], audit ARGV[5]) unless the
// zone holds ARGV[6] others (the reply's first number: 0), with '-' it
// removes it and returns its audit.
var overrideIndex = redis.NewScript(`
local now = tonumber(ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
local ended = {}
for _, t in ipairs(gone) do
  ended[#ended + 1] = redis.call('HGET', KEYS[2], t) or ''
  redis.call('ZREM', KEYS[1], t)
  redis.call('HDEL', KEYS[2], t)
end
local ok, was = 1, ''
if ARGV[3] == '+' then
  if not redis.call('ZSCORE', KEYS[1], ARGV[2]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[6]) then
    ok = 0
  else
    redis.call('ZADD', KEYS[1], ARGV[4], ARGV[2])
    redis.call('HSET', KEYS[2], ARGV[2], ARGV[5])
  end
elseif ARGV[3] == '-' then
  was = redis.call('HGET', KEYS[2], ARGV[2]) or ''
  redis.call('ZREM', KEYS[1], ARGV[2])
  redis.call('HDEL', KEYS[2], ARGV[2])
end
return {ok, was, ended}
`)

// overrideKey is the key of a key's override: beside its state.
func (s *Store) overrideKey(zone string, key algorithms.Key) string {
	return s.Key(zone, key) + ":o"
}

// overrideIndexKeys are the keys of a zone's index.
func (s *Store) overrideIndexKeys(zone string) []string {
	tag := "ovr:" + zone
	if _, enc := zonename.KeyLen(zone); enc {
		tag = string(zonename.AppendKey([]byte("ovr:"), zone))
	}
	return []string{s.ctlKey(tag, "exp"), s.ctlKey(tag, "meta")}
}

// overrideLen is the length of an override as the script reads it.
const overrideLen = 29

// encodeOverride is an override as the script reads it (lua/take.lua's
// OVFMT): its kind, then its expiry, events, window and capacity, each a
// 7-byte big-endian integer.
func encodeOverride(o algorithms.Override) string {
	b := make([]byte, 1, overrideLen)
	b[0] = 'l'
	n := [4]int64{o.Expires, o.Events, o.Window, o.Capacity()}
	switch {
	case o.Block:
		b[0], n[1], n[2], n[3] = 'b', 0, 0, 0
	case o.Unlimited:
		b[0], n[1], n[2], n[3] = 'u', 0, 0, 0
	}
	for _, x := range n {
		for sh := 48; sh >= 0; sh -= 8 {
			b = append(b, byte(x>>sh))
		}
	}
	return string(b)
}

// audit is an override as its zone's index keeps it (JSON).
type audit struct {
	Key                   string `json:"key"` // the token's 18 bytes, in hex
	Events, Window, Burst int64
	Block, Unlimited      bool
	Expires               int64
	Reason, By            string
	At                    int64
}

func encodeAudit(e stores.OverrideEntry) string {
	o := e.Override
	b, _ := json.Marshal(audit{Key: hex.EncodeToString(e.Key[:]), Events: o.Events, Window: o.Window, Burst: o.Burst,
		Block: o.Block, Unlimited: o.Unlimited, Expires: o.Expires, Reason: e.Reason, By: e.By, At: e.At})
	return string(b)
}

func decodeAudit(v string) (stores.OverrideEntry, bool) {
	var a audit
	if json.Unmarshal([]byte(v), &a) != nil {
		return stores.OverrideEntry{}, false
	}
	k, err := hex.DecodeString(a.Key)
	if err != nil || len(k) != algorithms.KeySize {
		return stores.OverrideEntry{}, false
	}
	e := stores.OverrideEntry{Override: algorithms.Override{Events: a.Events, Window: a.Window, Burst: a.Burst,
		Block: a.Block, Unlimited: a.Unlimited, Expires: a.Expires}, Reason: a.Reason, By: a.By, At: a.At}
	copy(e.Key[:], k)
	return e, true
}

// decodeOverride reads an override as the script does (encodeOverride);
// false for none or a malformed one.
func decodeOverride(v string) (algorithms.Override, bool) {
	var o algorithms.Override
	if len(v) != overrideLen {
		return o, false
	}
	var n [4]int64
	for i := range n {
		for _, c := range []byte(v[1+7*i : 8+7*i]) {
			n[i] = n[i]<<8 | int64(c)
		}
	}
	o.Expires = n[0]
	switch v[0] {
	case 'b':
		o.Block = true
	case 'u':
		o.Unlimited = true
	case 'l':
		o.Events, o.Window = n[1], n[2]
		if n[3] != n[1] {
			o.Burst = n[3]
		}
		if o.Events <= 0 || o.Window <= 0 {
			return o, false
		}
	default:
		return o, false
	}
	return o, true
}

// index runs overrideIndex for zone.
func (s *Store) index(ctx context.Context, zone string, now int64, args ...any) (ok bool, was string, ended []stores.OverrideEntry, err error) {
	v, err := overrideIndex.Run(ctx, s.client, s.overrideIndexKeys(zone), append([]any{now}, args...)...).Slice()
	if err != nil {
		return false, "", nil, err
	}
	if len(v) != 3 {
		return false, "", nil, errors.New("redis: the override index script's reply is malformed")
	}
	n, _ := v[0].(int64)
	was, _ = v[1].(string)
	list, _ := v[2].([]any)
	for _, x := range list {
		if str, _ := x.(string); str != "" {
			if e, good := decodeAudit(str); good {
				ended = append(ended, e)
			}
		}
	}
	return n == 1, was, ended, nil
}

// SetOverride implements stores.Overrider: the index first (its bound),
// then the override beside the key's state, then the resets counter, so
// that every instance's deny cache forgets refusals made without it
// (watch.go).
func (s *Store) SetOverride(ctx context.Context, zone string, e stores.OverrideEntry, maxN int) error {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, minAdminTimeout))
	defer cancel()
	tok := e.Key.String()
	ok, _, _, err := s.index(ctx, zone, e.At, tok, "+", e.Expires, encodeAudit(e), maxN)
	if err != nil {
		return err
	}
	if !ok {
		return stores.ErrTooManyOverrides
	}
	if err := s.client.Do(ctx, "SET", s.overrideKey(zone, e.Key), encodeOverride(e.Override), "PXAT", e.Expires).Err(); err != nil {
		return err
	}
	s.deny.Forget(zone, e.Key) // this instance's refusals of the key end at once
	return s.tellResets(ctx)
}

// tellResets increments the resets counter the watch polls (watch.go).
func (s *Store) tellResets(ctx context.Context) error {
	if err := s.client.Incr(ctx, s.resetsKey()).Err(); err != nil {
		return errors.New("the other instances could not be told; their deny caches may answer the key's refusals until these end: " + err.Error())
	}
	return nil
}

// DeleteOverride implements stores.Overrider.
func (s *Store) DeleteOverride(ctx context.Context, zone string, key algorithms.Key) (stores.OverrideEntry, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, minAdminTimeout))
	defer cancel()
	now, err := s.client.Time(ctx).Result()
	if err != nil {
		return stores.OverrideEntry{}, false, err
	}
	_, was, _, err := s.index(ctx, zone, now.UnixMilli(), key.String(), "-")
	if err != nil {
		return stores.OverrideEntry{}, false, err
	}
	if err := s.client.Del(ctx, s.overrideKey(zone, key)).Err(); err != nil {
		return stores.OverrideEntry{}, false, err
	}
	s.deny.Forget(zone, key)
	e, found := decodeAudit(was)
	if !found {
		return e, false, nil
	}
	return e, true, s.tellResets(ctx)
}

// Overrides implements stores.Overrider, by Redis's clock.
func (s *Store) Overrides(ctx context.Context, zone string) (live, expired []stores.OverrideEntry, err error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, minAdminTimeout))
	defer cancel()
	now, expired, err := s.expireOverrides(ctx, zone)
	if err != nil {
		return nil, nil, err
	}
	vals, err := s.client.HVals(ctx, s.overrideIndexKeys(zone)[1]).Result()
	if err != nil {
		return nil, expired, err
	}
	for _, v := range vals {
		if e, ok := decodeAudit(v); ok && e.Expires > now {
			live = append(live, e)
		}
	}
	return live, expired, nil
}

// ExpireOverrides implements stores.Overrider.
func (s *Store) ExpireOverrides(ctx context.Context, zone string) (int, []stores.OverrideEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, minAdminTimeout))
	defer cancel()
	_, expired, err := s.expireOverrides(ctx, zone)
	if err != nil {
		return 0, nil, err
	}
	n, err := s.client.ZCard(ctx, s.overrideIndexKeys(zone)[0]).Result()
	return int(n), expired, err
}

// expireOverrides removes the zone's ended overrides from its index and
// returns them, with Redis's time (ms). Without a script (a user that may
// run none still lists): each goes to the caller whose ZREM removes it.
func (s *Store) expireOverrides(ctx context.Context, zone string) (int64, []stores.OverrideEntry, error) {
	t, err := s.client.Time(ctx).Result()
	if err != nil {
		return 0, nil, err
	}
	now := t.UnixMilli()
	ik := s.overrideIndexKeys(zone)
	gone, err := s.client.ZRangeByScore(ctx, ik[0], &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(now, 10)}).Result()
	if err != nil {
		return 0, nil, err
	}
	var expired []stores.OverrideEntry
	for _, tok := range gone {
		if n, err := s.client.ZRem(ctx, ik[0], tok).Result(); err != nil || n == 0 {
			continue
		}
		v, _ := s.client.HGet(ctx, ik[1], tok).Result()
		s.client.HDel(ctx, ik[1], tok)
		if e, ok := decodeAudit(v); ok {
			expired = append(expired, e)
		}
	}
	return now, expired, nil
}

// PeekOverrides implements stores.Overrider: the override the script
// would read, with its audit from the index.
func (s *Store) PeekOverrides(ctx context.Context, zone string, keys []algorithms.Key, out []*stores.OverrideEntry) error {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, minAdminTimeout))
	defer cancel()
	now, err := s.client.Time(ctx).Result()
	if err != nil {
		return err
	}
	meta := s.overrideIndexKeys(zone)[1]
	for i, k := range keys {
		out[i] = nil
		n, err := s.client.Exists(ctx, s.overrideKey(zone, k)).Result()
		if err != nil {
			return err
		}
		if n == 0 {
			continue
		}
		v, err := s.client.HGet(ctx, meta, k.String()).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return err
		}
		if e, ok := decodeAudit(v); ok && e.Expires > now.UnixMilli() {
			out[i] = &e
		}
	}
	return nil
}

// The Caddy module's side (Redis): see Store's.

// SetOverride implements stores.Overrider.
func (r *Redis) SetOverride(ctx context.Context, zone string, e stores.OverrideEntry, maxN int) error {
	if r.Store == nil {
		return errors.New("store redis: not provisioned")
	}
	return r.Store.SetOverride(ctx, zone, e, maxN)
}

// DeleteOverride implements stores.Overrider.
func (r *Redis) DeleteOverride(ctx context.Context, zone string, key algorithms.Key) (stores.OverrideEntry, bool, error) {
	if r.Store == nil {
		return stores.OverrideEntry{}, false, errors.New("store redis: not provisioned")
	}
	return r.Store.DeleteOverride(ctx, zone, key)
}

// Overrides implements stores.Overrider.
func (r *Redis) Overrides(ctx context.Context, zone string) (live, expired []stores.OverrideEntry, err error) {
	if r.Store == nil {
		return nil, nil, errors.New("store redis: not provisioned")
	}
	return r.Store.Overrides(ctx, zone)
}

// ExpireOverrides implements stores.Overrider.
func (r *Redis) ExpireOverrides(ctx context.Context, zone string) (int, []stores.OverrideEntry, error) {
	if r.Store == nil {
		return 0, nil, errors.New("store redis: not provisioned")
	}
	return r.Store.ExpireOverrides(ctx, zone)
}

// PeekOverrides implements stores.Overrider.
func (r *Redis) PeekOverrides(ctx context.Context, zone string, keys []algorithms.Key, out []*stores.OverrideEntry) error {
	if r.Store == nil {
		return errors.New("store redis: not provisioned")
	}
	return r.Store.PeekOverrides(ctx, zone, keys, out)
}

var (
	_ stores.Overrider = (*Store)(nil)
	_ stores.Overrider = (*Redis)(nil)
)
