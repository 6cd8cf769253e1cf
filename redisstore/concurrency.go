package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Concurrency zones in Redis (lua/concurrency.lua): a slot is a member of
// the key's sorted set, its holder id, scored by the instant its lease
// expires; Take adds it in the request's one script call. The slot keeper
// (slotKeeper) keeps this instance's held slots: it renews each one that
// has lived half its lease, and sends the releases Release queues (a ZREM),
// retrying a failed one until the slot would have expired anyway. A
// decision whose reply never came, or that its caller abandoned, may have
// taken slots: Take queues their release at once. docs/redis.md,
// "Concurrency zones: leases" and "The slot keeper".

// SlotsKey returns the Redis key of one concurrency zone's slots for one
// identity: its sorted set of leases, <prefix><zone>:{<token>}:slots. The
// hash tag is the identity's, as for the rate zones (Key), so a request's
// zones of one identity share a Cluster slot; the suffix keeps a
// concurrency zone's set and a rate zone's value apart when a reload
// changes a zone's kind under the same name (each starts afresh, as a
// changed algorithm does, instead of reading the other's state).
func (s *Store) SlotsKey(zone string, key algorithms.Key) string {
	var buf [256]byte
	return string(append(s.appendKey(buf[:0], zone, key), slotsSuffix...))
}

const slotsSuffix = ":slots"

// keyOf returns the key of r's state: SlotsKey for a concurrency zone,
// Key for a rate zone.
func (s *Store) keyOf(r *algorithms.Request) string {
	return s.zoneKey(r.Zone, r.Key, r.Limit.Algorithm)
}

func (s *Store) zoneKey(zone string, key algorithms.Key, alg algorithms.Algorithm) string {
	var buf [256]byte
	return string(s.appendZoneKey(buf[:0], zone, key, alg))
}

// appendZoneKey appends zoneKey's key to b.
func (s *Store) appendZoneKey(b []byte, zone string, key algorithms.Key, alg algorithms.Algorithm) []byte {
	b = s.appendKey(b, zone, key)
	if alg == algorithms.Concurrency {
		b = append(b, slotsSuffix...)
	}
	return b
}

// Lease upkeep timing.
const (
	keeperTick        = 250 * time.Millisecond // renewal scan and retry pace
	keeperQueue       = 4096                   // queued releases and renewals
	keeperMaxPipeline = 64                     // per pipeline
	releaseBackoff0   = 250 * time.Millisecond
	releaseBackoffN   = 5 * time.Second
)

// slotOp is a release or a renewal on its way to Redis.
type slotOp struct {
	req   algorithms.Request
	key   string // the slots key (SlotsKey), "" until known
	renew bool
	// until is monoNow() past which a release is no longer needed (the
	// lease has expired by itself); next is when to send it again.
	until, next int64
	backoff     time.Duration
}

// heldSlot is a lease held by a running request of this instance.
type heldSlot struct {
	req     algorithms.Request
	key     string // its slots key
	renewed int64  // monoNow() of the admission or the last renewal sent
}

const keeperShards = 16

type keeperShard struct {
	mu   sync.Mutex
	live map[uint64]heldSlot
	_    [48]byte
}

// slotKeeper holds a store's leases (see above). Its worker starts with
// the first lease.
type slotKeeper struct {
	s      *Store
	shards [keeperShards]keeperShard
	ops    chan slotOp
	stop   chan struct{}
	done   chan struct{}
	start  sync.Once
	closed sync.Once
	// givenUp counts the operations that failed for good, by op (release:
	// left to expire; renew: the next tick tries again, or the lease
	// expires).
	givenUp [2]prometheus.Counter
	// The worker's buffers, reused from batch to batch.
	calls []call
	cmds  []redis.Cmder
}

func newSlotKeeper(s *Store, target string) *slotKeeper {
	k := &slotKeeper{s: s, ops: make(chan slotOp, keeperQueue), stop: make(chan struct{}), done: make(chan struct{})}
	for i := range k.shards {
		k.shards[i].live = map[uint64]heldSlot{}
	}
	k.givenUp[0] = storeMetrics.leaseFailures.WithLabelValues("redis", target, "release")
	k.givenUp[1] = storeMetrics.leaseFailures.WithLabelValues("redis", target, "renew")
	return k
}

func (k *slotKeeper) shard(id uint64) *keeperShard { return &k.shards[id%keeperShards] }

// run starts the worker once.
func (k *slotKeeper) run() {
	k.start.Do(func() { go k.work() })
}

// close stops the worker, once it has sent up to a batch of the releases
// queued (the others, and failed ones, are left to their leases' expiry).
func (k *slotKeeper) close() {
	k.closed.Do(func() {
		close(k.stop)
		started := true
		k.start.Do(func() { started = false })
		if started {
			<-k.done
		}
	})
}

// holdsSlot reports whether reqs hold a concurrency zone.
func holdsSlot(reqs []algorithms.Request) bool {
	for i := range reqs {
		if reqs[i].Limit.Algorithm == algorithms.Concurrency {
			return true
		}
	}
	return false
}

// admitted registers the leases Take just granted (reqs decided as out):
// the concurrency zones that allowed, when every enforcing zone did.
func (k *slotKeeper) admitted(reqs []algorithms.Request, out []algorithms.Decision) {
	if !holdsSlot(reqs) {
		return
	}
	for i := range reqs {
		if !out[i].Allowed && !reqs[i].ReportOnly {
			return // refused: nothing was taken
		}
	}
	now := monoNow()
	for i := range reqs {
		r := &reqs[i]
		if r.Limit.Algorithm != algorithms.Concurrency || !out[i].Allowed {
			continue
		}
		l := heldSlot{req: *r, key: k.s.SlotsKey(r.Zone, r.Key), renewed: now}
		sh := k.shard(r.Holder)
		sh.mu.Lock()
		sh.live[r.Holder] = l
		sh.mu.Unlock()
	}
	k.run()
}

// undecided queues the release of reqs' leases after a Take that failed in
// a way that may have taken them (Redis may have run the script).
func (k *slotKeeper) undecided(reqs []algorithms.Request, err error, abandoned bool) {
	if !holdsSlot(reqs) || !abandoned && !errors.As(err, new(*unknownError)) {
		return
	}
	now := monoNow()
	for i := range reqs {
		if r := &reqs[i]; r.Limit.Algorithm == algorithms.Concurrency {
			k.queue(slotOp{req: *r, until: now + r.Limit.Window*int64(time.Millisecond)})
		}
	}
}

// Release gives back the slots Take granted to the concurrency zones of
// reqs (their Holder): it stops renewing them and queues their release,
// without waiting for Redis (see above). Requests of other zones are
// ignored. It never fails; a release that cannot reach Redis leaves the
// slot to its lease's expiry.
func (s *Store) Release(_ context.Context, reqs []algorithms.Request) error {
	k := s.slots
	now := monoNow()
	for i := range reqs {
		r := &reqs[i]
		if r.Limit.Algorithm != algorithms.Concurrency || r.Holder == 0 {
			continue
		}
		renewed, key := now, ""
		sh := k.shard(r.Holder)
		sh.mu.Lock()
		if l, ok := sh.live[r.Holder]; ok {
			renewed, key = l.renewed, l.key
			delete(sh.live, r.Holder)
		}
		sh.mu.Unlock()
		k.queue(slotOp{req: *r, key: key, until: renewed + r.Limit.Window*int64(time.Millisecond)})
	}
	return nil
}

// Release implements the concurrency side of the store contract (see
// Store.Release).
func (r *Redis) Release(ctx context.Context, reqs []algorithms.Request) error {
	if r.Store == nil {
		return errors.New("store redis: not provisioned")
	}
	return r.Store.Release(ctx, reqs)
}

// inUse reports whether requests still hold slots of s or use it
// otherwise (Pin, refunds not yet sent).
func (s *Store) inUse() bool { return s.pins.Load() > 0 || s.HeldSlots() > 0 }

// HeldSlots returns the concurrency slots this instance's running requests hold (for
// tests).
func (s *Store) HeldSlots() int {
	n := 0
	for i := range s.slots.shards {
		sh := &s.slots.shards[i]
		sh.mu.Lock()
		n += len(sh.live)
		sh.mu.Unlock()
	}
	return n
}

// queue hands op to the worker without blocking: a full queue gives it up.
func (k *slotKeeper) queue(op slotOp) {
	k.run()
	select {
	case k.ops <- op:
	default:
		k.giveUp(&op)
	}
}

func (k *slotKeeper) giveUp(op *slotOp) {
	if op.renew {
		k.givenUp[1].Inc()
	} else {
		k.givenUp[0].Inc()
	}
}

// work sends the queued operations, renews the leases due every tick, and
// sends failed releases again when their backoff is over.
func (k *slotKeeper) work() {
	defer close(k.done)
	tick := time.NewTicker(keeperTick)
	defer tick.Stop()
	var batch, retry []slotOp
	for {
		batch = batch[:0]
		select {
		case <-k.stop:
			// The releases queued until now are sent (a store closes once
			// its requests have released their slots: Store.Destruct).
			for len(batch) < keeperMaxPipeline && len(k.ops) > 0 {
				if op := <-k.ops; !op.renew {
					batch = append(batch, op)
				}
			}
			if len(batch) > 0 {
				k.send(batch, nil)
			}
			return
		case op := <-k.ops:
			batch = append(batch, op)
		drain:
			for len(batch) < keeperMaxPipeline {
				select {
				case op := <-k.ops:
					batch = append(batch, op)
				default:
					break drain
				}
			}
		case <-tick.C:
			now := monoNow()
			batch = k.due(batch, now)
			kept := retry[:0]
			for _, op := range retry {
				switch {
				case now >= op.until:
					k.giveUp(&op) // expired by itself by now
				case now >= op.next:
					batch = append(batch, op)
				default:
					kept = append(kept, op)
				}
			}
			clear(retry[len(kept):])
			retry = kept
		}
		for len(batch) > 0 {
			n := min(len(batch), keeperMaxPipeline)
			retry = k.send(batch[:n], retry)
			batch = batch[n:]
		}
	}
}

// due appends a renewal of every live lease that has lived half its length
// since its admission or last renewal.
func (k *slotKeeper) due(batch []slotOp, now int64) []slotOp {
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		for id, l := range sh.live {
			if now-l.renewed >= l.req.Limit.Window*int64(time.Millisecond)/2 {
				l.renewed = now
				sh.live[id] = l
				batch = append(batch, slotOp{req: l.req, key: l.key, renew: true})
			}
		}
		sh.mu.Unlock()
	}
	return batch
}

// send sends ops as one pipeline (on the decisions' deadline plus the
// grace) and returns retry with the releases to send again. A release is a
// plain ZREM of the lease (what the script's refund mode does, at a
// fraction of a script call's cost in Redis and here); a renewal runs the
// script (renew mode), which reads Redis's clock.
func (k *slotKeeper) send(ops []slotOp, retry []slotOp) []slotOp {
	s := k.s
	if b := s.breaker; b != nil && b.state.Load() != circuitClosed && monoNow() < b.until.Load() {
		// Redis is known down: do not wait on it during the cool-down.
		// Past it, try (the decisions' probe may be long in coming when no
		// request arrives); the outcome is not the breaker's to count.
		return k.failed(ops, retry, monoNow())
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout+s.opts.Grace)
	defer cancel()
	pipe := s.client.Pipeline()
	n := len(ops)
	if cap(k.calls) < n {
		k.calls, k.cmds = make([]call, n), make([]redis.Cmder, n)
	}
	calls, cmds := k.calls[:n], k.cmds[:n]
	defer func() {
		clear(cmds)
		for i := range calls {
			calls[i].cmd, calls[i].raw = nil, nil
			clear(calls[i].argv)
		}
	}()
	renewals := false
	name, fn := s.scripts.command()
	for i := range ops {
		op := &ops[i]
		if op.key == "" {
			op.key = s.SlotsKey(op.req.Zone, op.req.Key)
		}
		if !op.renew {
			cmds[i] = pipe.ZRem(ctx, op.key, op.req.Holder)
			continue
		}
		// The script's arguments of one concurrency zone in renew mode
		// (written by argCache, as every zone's).
		renewals = true
		c := &calls[i]
		c.setKeysBy(1, func(b []byte, _ int) []byte { return append(b, op.key...) })
		c.addArgsBy(1, func(b []byte, _ int) []byte { return s.argc.appendRenewal(b, &op.req) })
		c.argv[0], c.argv[1] = name, fn
		c.cmd = c.rawCmd(false)
		_ = pipe.Process(ctx, c.cmd)
		cmds[i] = c.cmd
	}
	_, _ = pipe.Exec(ctx)
	if renewals {
		// A renewal that met a Redis without the code (restarted, flushed)
		// loads it and is sent again, as a decision is.
		var again redis.Pipeliner
		var load libLoad
		for i := range ops {
			if !ops[i].renew {
				continue
			}
			err := calls[i].replyErr()
			if err == nil || !s.scripts.retriable(err) {
				continue
			}
			if again == nil {
				again = s.client.Pipeline()
			}
			s.scripts.retry(ctx, again, &calls[i], err, &load)
			cmds[i] = calls[i].cmd
		}
		if again != nil && again.Len() > 0 {
			_, _ = again.Exec(ctx)
		}
	}
	var bad []slotOp
	for i := range cmds {
		if cmds[i].Err() != nil || ops[i].renew && calls[i].replyErr() != nil {
			bad = append(bad, ops[i])
		}
	}
	return k.failed(bad, retry, monoNow())
}

// failed schedules the failed releases of ops again (until their lease has
// expired by itself) and gives up the renewals (the next tick renews a
// lease still held).
func (k *slotKeeper) failed(ops []slotOp, retry []slotOp, now int64) []slotOp {
	for _, op := range ops {
		if op.renew {
			k.giveUp(&op)
			continue
		}
		op.backoff = min(max(2*op.backoff, releaseBackoff0), releaseBackoffN)
		op.next = now + int64(op.backoff)
		if op.next >= op.until {
			k.giveUp(&op)
			continue
		}
		retry = append(retry, op)
	}
	return retry
}

// peekSlots is peekOn for a concurrency zone: each key's leases that have
// not expired at Redis's time are its slots in use (found: at least one).
func peekSlots(ctx context.Context, c redis.Cmdable, names []string, l algorithms.Limit, out []algorithms.Decision, found []bool) error {
	pipe := c.Pipeline()
	now := pipe.Time(ctx)
	sets := make([]*redis.ZSliceCmd, len(names))
	for i, n := range names {
		sets[i] = pipe.ZRangeWithScores(ctx, n, 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	t, err := now.Result()
	if err != nil {
		return err
	}
	ms := float64(t.UnixMilli())
	for i, set := range sets {
		used := int64(0)
		for _, z := range set.Val() {
			if z.Score > ms {
				used++
			}
		}
		out[i] = algorithms.Peek(algorithms.State{Alg: algorithms.Concurrency, Debt: used}, false, l, t.UnixMilli())
		found[i] = used > 0
	}
	return nil
}
