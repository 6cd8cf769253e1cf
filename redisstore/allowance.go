package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/stores"
)

// The local allowance (zone setting local_allowance): a hot key's budget
// drawn from Redis in grants and spent here. docs/redis.md, "Local
// allowance", tells how it works, why it never admits more than the limit,
// its bound (refusing early), which algorithms it takes and its failures.
//
// What the code below keeps to: a lease (zone, key, limit) decides a
// request alone when it holds the cost and has not expired; otherwise the
// request goes to Redis in its one script call with its cost raised by a
// grant, so a refusal charges nothing. A lease holds at most MaxGrant
// units; its unspent units go back by the sweep (refund mode). A lease is
// forgotten, unspent, when Redis's state may be gone (lost connection, or
// the watch sees a restart or flush); no grant is drawn after a failed
// call until one succeeds, nor before the watch's first successful poll.
// A refund is sent again only when it surely did not reach Redis.

// Allowance settings and bounds.
const (
	// DefaultAllowanceExpiry is how long drawn units stay spendable.
	DefaultAllowanceExpiry = 100 * time.Millisecond
	// MinAllowanceExpiry and MaxAllowanceExpiry bound the setting.
	MinAllowanceExpiry = 10 * time.Millisecond
	MaxAllowanceExpiry = 5 * time.Second
	// AllowanceFraction: a lease holds at most Capacity/AllowanceFraction
	// units.
	AllowanceFraction = 10
	// maxLeases bounds the leases one store keeps (hot keys are few); a
	// key beyond it is decided by Redis every time.
	maxLeases = 10000
	// refundGiveUp is how long an unsent refund is retried.
	refundGiveUp = 10 * time.Second
	// maxRefundsInFlight bounds the refunds one sweep sends at once (they
	// share the pipelines with decisions).
	maxRefundsInFlight = 64
)

// Drawable reports whether a grant of alg's budget can be drawn and
// returned exactly (see above).
func Drawable(alg algorithms.Algorithm) bool {
	return alg == algorithms.TokenBucket || alg == algorithms.GCRA
}

// MaxGrant is the most units a lease holds under limit l with a zone max of
// max (0: none): max, at most l's capacity / AllowanceFraction.
func MaxGrant(l algorithms.Limit, max int64) int64 {
	b := l.Capacity() / AllowanceFraction
	if max > 0 && max < b {
		b = max
	}
	return b
}

// allowanceCfg is a zone's allowance.
type allowanceCfg struct {
	max    int64 // 0: capacity / AllowanceFraction
	expiry time.Duration
}

// allowanceReg is one registration of a zone's allowance (a handler's).
type allowanceReg struct {
	id  uint64
	cfg allowanceCfg
}

// allowances is a store's leases and the zones that have an allowance.
type allowances struct {
	s *Store

	regMu sync.Mutex
	regs  map[string][]allowanceReg // zone → live registrations, newest last
	next  uint64
	zones atomic.Pointer[map[string]allowanceCfg] // the newest of each zone; nil: none

	shards [allowShards]allowShard
	count  atomic.Int64 // leases held

	owedMu sync.Mutex
	owed   []owedRefund // refunds not sent yet
	// returning is the units of a sweep's refunds, from when it takes them
	// from the leases and owed until every outcome is recorded (returned,
	// lost, or owed again). What the instance holds is the leases' units,
	// owed and returning (for a moment after a refund lands, counted in
	// both returning and returned).
	returning atomic.Int64

	sweepOnce sync.Once // starts the sweeper
	stop      chan struct{}
	done      chan struct{}

	// paused stops grants after a failed call until one succeeds: a draw
	// that gets no reply may be charged when Redis recovers, so an outage
	// costs at most the grants in flight when it began (a key's are at
	// most its maxGrant), not one per failed request.
	paused atomic.Bool
	// watch sees Redis restarted or flushed and then forgets the leases;
	// no grant is drawn before its first successful poll (a restart
	// before it would go unseen, and a lease drawn before it spent on top
	// of the restarted Redis's budget).
	watch *watcher

	units     [5]prometheus.Counter // by event (unitEvents), this store's labels
	decisions prometheus.Counter
	// tally is this store's own count of units by event (the metric is
	// shared by every store of one target).
	tally [5]atomic.Int64
}

// Allowance unit events (tally's index; the metric's event label): drawn
// (grants Redis confirmed), spent (by requests decided here), returned
// (refunds Redis confirmed), lost (held units dropped unspent: Redis lost,
// or a refund given up), unconfirmed (grants whose draw got no reply:
// Redis may have charged them). drawn = spent + returned + lost + held
// (the leases' units, owed refunds and refunds in flight).
const (
	unitsDrawn = iota
	unitsSpent
	unitsReturned
	unitsLost
	unitsUnconfirmed
)

var unitEvents = [5]string{"drawn", "spent", "returned", "lost", "unconfirmed"}

// add counts n units of event.
func (a *allowances) add(event int, n int64) {
	if n <= 0 {
		return
	}
	a.tally[event].Add(n)
	a.units[event].Add(float64(n))
}

const allowShards = 32

type allowShard struct {
	mu sync.Mutex
	m  map[leaseKey]*lease
}

// leaseKey names a lease: a key's state in Redis under one limit.
type leaseKey struct {
	zone  string
	key   algorithms.Key
	limit algorithms.Limit
}

// lease is one key's allowance on this instance. Guarded by its shard's
// mutex.
type lease struct {
	left    int64     // units drawn and not spent
	pending int64     // units being drawn (calls in flight)
	expires time.Time // left may be spent before
	// What Redis last said of the key (a draw, or a request decided there):
	// the units left after it (-1: nothing yet), and when the key is full
	// again (local time); for the headers of local decisions, and to size
	// grants.
	remaining int64
	resetAt   time.Time
	// Demand: the units requested in the current period of one expiry
	// (from win), and in the previous one.
	win       time.Time
	cur, prev int64
	used      time.Time // last request
}

// owedRefund is an expired lease's unspent units, to be returned.
type owedRefund struct {
	k     leaseKey
	units int64
	since time.Time
}

func newAllowances(s *Store) *allowances {
	a := &allowances{s: s, regs: map[string][]allowanceReg{}, stop: make(chan struct{}), done: make(chan struct{})}
	for i := range a.shards {
		a.shards[i].m = map[leaseKey]*lease{}
	}
	for i, e := range unitEvents {
		a.units[i] = storeMetrics.allowanceUnits.WithLabelValues("redis", s.opts.Target, e)
	}
	a.decisions = storeMetrics.allowanceDecisions.WithLabelValues("redis", s.opts.Target)
	return a
}

// LocalAllowance gives zone, whose (default) limit is l, a local allowance
// (a Caddy handler calls it at Provision): max units per lease at most (0:
// a tenth of the capacity), spendable for expiry (0:
// DefaultAllowanceExpiry). The returned release ends this registration (at
// the handler's Cleanup); while a zone has several (a config reload), the
// newest applies.
func (s *Store) LocalAllowance(zone string, l algorithms.Limit, max int64, expiry time.Duration) (release func(), err error) {
	if expiry == 0 {
		expiry = DefaultAllowanceExpiry
	}
	switch {
	case !Drawable(l.Algorithm):
		return nil, fmt.Errorf("local_allowance: not with %s: a batch drawn in one window and spent or returned in the next would count in the wrong window (token_bucket and gcra draw and return exactly)", l.Algorithm)
	case max < 0:
		return nil, fmt.Errorf("local_allowance: the batch size must be positive, got %d", max)
	case MaxGrant(l, max) < 1:
		return nil, fmt.Errorf("local_allowance: a batch is at most a tenth of the capacity, and the capacity is %d: it needs at least %d", l.Capacity(), AllowanceFraction)
	case expiry < MinAllowanceExpiry || expiry > MaxAllowanceExpiry:
		return nil, fmt.Errorf("local_allowance: the expiry must be between %s and %s, got %s", MinAllowanceExpiry, MaxAllowanceExpiry, expiry)
	}
	a := s.allowances()
	a.regMu.Lock()
	a.next++
	id := a.next
	a.regs[zone] = append(a.regs[zone], allowanceReg{id: id, cfg: allowanceCfg{max: max, expiry: expiry}})
	a.publish()
	a.regMu.Unlock()
	a.sweepOnce.Do(func() { go a.sweep() })
	var once sync.Once
	return func() {
		once.Do(func() {
			a.regMu.Lock()
			defer a.regMu.Unlock()
			rs := a.regs[zone]
			for i, r := range rs {
				if r.id == id {
					rs = append(rs[:i:i], rs[i+1:]...)
					break
				}
			}
			if len(rs) == 0 {
				delete(a.regs, zone)
			} else {
				a.regs[zone] = rs
			}
			a.publish()
		})
	}, nil
}

// allowances returns s's allowances, made on first use.
func (s *Store) allowances() *allowances {
	s.allowMu.Lock()
	defer s.allowMu.Unlock()
	if a := s.allow.Load(); a != nil {
		return a
	}
	if s.watch == nil {
		// The watch sees a restart or a flush (the leases' charge gone) even
		// without a deny cache.
		s.watch = startWatch(s)
	}
	a := newAllowances(s)
	a.watch = s.watch
	s.allow.Store(a)
	return a
}

// publish makes the newest registration of each zone the one Take reads.
// Called with regMu held.
func (a *allowances) publish() {
	if len(a.regs) == 0 {
		a.zones.Store(nil)
		return
	}
	m := make(map[string]allowanceCfg, len(a.regs))
	for z, rs := range a.regs {
		m[z] = rs[len(rs)-1].cfg
	}
	a.zones.Store(&m)
}

// close stops the sweeper, then returns what the leases hold (each refund
// bounded by the store's timeout): the store is going away.
func (a *allowances) close() {
	started := true
	a.sweepOnce.Do(func() { started = false }) // no sweeper after this
	close(a.stop)
	if started {
		<-a.done
	}
	a.sweepOnce1(time.Now().Add(MaxAllowanceExpiry + refundGiveUp))
}

// uses reports whether any of reqs is served through an allowance.
func (a *allowances) uses(cfgs map[string]allowanceCfg, reqs []algorithms.Request) bool {
	for i := range reqs {
		if _, ok := cfgs[reqs[i].Zone]; ok && !reqs[i].ReportOnly && Drawable(reqs[i].Limit.Algorithm) {
			return true
		}
	}
	return false
}

func (a *allowances) shard(k *leaseKey) *allowShard {
	h := uint32(2166136261)
	for i := range k.key {
		h = (h ^ uint32(k.key[i])) * 16777619
	}
	for i := 0; i < len(k.zone); i++ {
		h = (h ^ uint32(k.zone[i])) * 16777619
	}
	return &a.shards[h%allowShards]
}

// plan is what the allowance does with one zone of a request.
type plan struct {
	lease *lease
	k     leaseKey
	local bool  // decided from the lease: cost reserved
	grant int64 // units drawn with the request (in pending)
}

// takeAllowance decides reqs, some of whose zones have an allowance (see
// the top of this file): from leases where they can, in one Redis call for
// the rest.
func (s *Store) takeAllowance(ctx context.Context, next stores.Store, cfgs map[string]allowanceCfg, reqs []algorithms.Request, out []algorithms.Decision) error {
	a := s.allow.Load()
	now := time.Now()
	var pbuf [8]plan
	plans := pbuf[:0]
	if len(reqs) > len(pbuf) {
		plans = make([]plan, 0, len(reqs))
	}
	plans = plans[:len(reqs)]
	clear(plans)
	local := 0
	for i := range reqs {
		if a.planZone(cfgs, &reqs[i], &plans[i], &out[i], now) {
			local++
		}
	}
	if local == len(reqs) {
		// Every zone from its lease: spent (reserved above).
		var spent int64
		for i := range reqs {
			spent += reqs[i].Cost
		}
		a.add(unitsSpent, spent)
		a.decisions.Inc()
		return nil
	}

	// The rest goes to Redis in one call: zones not decided here, each
	// drawing its grant.
	buf := subTakes.Get().(*subTake)
	defer subTakes.Put(buf)
	sub, subOut := buf.reqs[:0], buf.out[:0]
	if n := len(reqs) - local; n > len(buf.reqs) {
		sub, subOut = make([]algorithms.Request, 0, n), make([]algorithms.Decision, 0, n)
	}
	for i := range reqs {
		if !plans[i].local {
			r := reqs[i]
			r.Cost += plans[i].grant
			r.FailApart = false // decided whole (no PartialError): the draws are settled for all zones at once
			sub = append(sub, r)
			subOut = append(subOut, algorithms.Decision{})
		}
	}
	sent := time.Now()
	err := next.Take(ctx, sub, subOut)
	if err == nil && a.grantRefused(plans, sub, subOut) {
		// A grant did not fit (and nothing was charged): decide the
		// request alone.
		j := 0
		for i := range reqs {
			if !plans[i].local {
				a.undraw(&plans[i], 0)
				sub[j].Cost = reqs[i].Cost
				j++
			}
		}
		sent = time.Now()
		err = next.Take(ctx, sub, subOut)
	}
	if err != nil {
		a.failed(reqs, plans, err)
		return err
	}
	a.paused.Store(false)
	a.commit(reqs, plans, out, subOut, sent)
	return nil
}

// planZone plans one zone r of a request with an allowance: decided from
// its lease when the lease has the cost left (reserved, *out set: true),
// else drawing a grant with the Redis call while draws are on.
func (a *allowances) planZone(cfgs map[string]allowanceCfg, r *algorithms.Request, p *plan, out *algorithms.Decision, now time.Time) (local bool) {
	cfg, ok := cfgs[r.Zone]
	if !ok || r.ReportOnly || !Drawable(r.Limit.Algorithm) {
		return false
	}
	p.k = leaseKey{zone: r.Zone, key: r.Key, limit: r.Limit}
	sh := a.shard(&p.k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := sh.m[p.k]
	if l == nil {
		if a.count.Load() >= maxLeases {
			return false
		}
		l = &lease{remaining: -1}
		sh.m[p.k] = l
		a.count.Add(1)
	}
	p.lease = l
	l.demand(now, r.Cost, cfg.expiry)
	if l.left >= r.Cost && now.Before(l.expires) {
		l.left -= r.Cost
		p.local = true
		*out = l.decision(r, now)
		return true
	}
	if !a.paused.Load() && a.watch.armed.Load() {
		p.grant = l.grantSize(MaxGrant(r.Limit, cfg.max), r.Cost, cfg.expiry)
		l.pending += p.grant
	}
	return false
}

// failed undoes the plans of a request Redis could not decide (err):
// the costs reserved from leases go back, the grants drawn are undone
// (counted unconfirmed when Redis may have charged them), and the draws
// pause until Redis answers again.
func (a *allowances) failed(reqs []algorithms.Request, plans []plan, err error) {
	a.paused.Store(true)
	lostDraw := errors.As(err, new(*unknownError))
	for i := range plans {
		p := &plans[i]
		switch {
		case p.lease == nil:
		case p.local:
			a.unreserve(p, reqs[i].Cost)
		case lostDraw:
			a.undraw(p, p.grant) // Redis may have charged it
		default:
			a.undraw(p, 0)
		}
	}
	if lost(err) {
		a.forget()
	}
}

// subTake is the room of the part of a request that takeAllowance passes
// on: recycled (subTakes), as it goes through the layers below and would
// escape to the heap.
type subTake struct {
	reqs [8]algorithms.Request
	out  [8]algorithms.Decision
}

var subTakes = sync.Pool{New: func() any { return new(subTake) }}

// grantRefused reports whether a zone that drew a grant refused the request
// (its grant, not its own cost, may be what did not fit).
func (a *allowances) grantRefused(plans []plan, sub []algorithms.Request, subOut []algorithms.Decision) bool {
	j := 0
	for i := range plans {
		if plans[i].local {
			continue
		}
		if plans[i].grant > 0 && !subOut[j].Allowed && !sub[j].ReportOnly {
			return true
		}
		j++
	}
	return false
}

// commit completes a decided request: Redis's decisions (subOut, for the
// zones not decided here, decided at sent) and the leases' go into out;
// when every enforcing zone allowed, reserved units are spent and drawn
// grants join their leases, else reserved units go back.
func (a *allowances) commit(reqs []algorithms.Request, plans []plan, out, subOut []algorithms.Decision, sent time.Time) {
	allowed := true
	j := 0
	for i := range reqs {
		if plans[i].local {
			continue
		}
		if !subOut[j].Allowed && !reqs[i].ReportOnly {
			allowed = false
		}
		j++
	}
	now := time.Now()
	j = 0
	spent := int64(0)
	drawn := int64(0)
	for i := range reqs {
		p := &plans[i]
		r := &reqs[i]
		if !p.local {
			d := subOut[j]
			j++
			if p.lease != nil {
				sh := a.shard(&p.k)
				sh.mu.Lock()
				l := p.lease
				l.pending -= p.grant
				if allowed && d.Allowed && p.grant > 0 {
					l.left += p.grant
					l.expires = sent.Add(a.expiry(r.Zone))
					drawn += p.grant
				}
				l.remaining = d.Remaining
				l.resetAt = sent.Add(d.ResetAfter)
				if l.left > 0 {
					d.Remaining += l.left // this instance can still spend them
				}
				sh.mu.Unlock()
			}
			out[i] = d
			continue
		}
		if !allowed {
			// Vetoed: the reserved units go back; the zone shows as it
			// stands.
			sh := a.shard(&p.k)
			sh.mu.Lock()
			p.lease.left += r.Cost
			out[i] = p.lease.decision(r, now)
			sh.mu.Unlock()
		} else {
			spent += r.Cost
		}
	}
	a.add(unitsSpent, spent)
	if drawn > 0 {
		a.add(unitsDrawn, drawn)
	}
}

// expiry is zone's allowance expiry now (the newest registration's).
func (a *allowances) expiry(zone string) time.Duration {
	if m := a.zones.Load(); m != nil {
		if c, ok := (*m)[zone]; ok {
			return c.expiry
		}
	}
	return DefaultAllowanceExpiry
}

// unreserve gives a reserved cost back to its lease.
func (a *allowances) unreserve(p *plan, cost int64) {
	sh := a.shard(&p.k)
	sh.mu.Lock()
	p.lease.left += cost
	sh.mu.Unlock()
}

// undraw ends a draw that did not join its lease; unconfirmed of its units
// are counted so (Redis may have charged them).
func (a *allowances) undraw(p *plan, unconfirmed int64) {
	if p.lease == nil || p.grant == 0 {
		return
	}
	sh := a.shard(&p.k)
	sh.mu.Lock()
	p.lease.pending -= p.grant
	sh.mu.Unlock()
	p.grant = 0
	a.add(unitsUnconfirmed, unconfirmed)
}

// decision is what a request r decided from the lease reports at now: what
// Redis said was left at the lease's last decision plus what the lease
// holds (what this instance can still spend), and the reset Redis gave
// then. Called with the shard's lock held.
func (l *lease) decision(r *algorithms.Request, now time.Time) algorithms.Decision {
	rem := l.left
	if l.remaining > 0 {
		rem += l.remaining
	}
	return algorithms.Decision{Allowed: true, Limit: r.Limit.Capacity(), Remaining: rem, ResetAfter: max(l.resetAt.Sub(now), 0)}
}

// demand counts cost units requested at now, in periods of one expiry.
func (l *lease) demand(now time.Time, cost int64, expiry time.Duration) {
	switch d := now.Sub(l.win); {
	case d >= 2*expiry:
		l.win, l.prev, l.cur = now, 0, 0
	case d >= expiry:
		l.win, l.prev, l.cur = now, l.cur, 0
	}
	l.cur += cost
	l.used = now
}

// grantSize is the units a request of cost c draws for the lease's next
// requests: the key's demand over the last expiry period (none for a key
// requested less than twice in it), within maxGrant less what the lease
// holds and is drawing, and within what Redis last said was left.
func (l *lease) grantSize(maxGrant, c int64, expiry time.Duration) int64 {
	est := max(l.prev, l.cur) - c
	if est < c {
		return 0 // not hot: no grant for a key requested about once per expiry
	}
	b := min(est, maxGrant-l.left-l.pending)
	if l.remaining >= 0 {
		b = min(b, l.remaining-c)
	}
	return max(b, 0)
}

// forget drops every lease and owed refund, unspent: the store lost Redis,
// whose state (and the charge of the leases) may be gone. Their units are
// counted lost.
func (a *allowances) forget() {
	if a == nil {
		return
	}
	var n int64
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for _, l := range sh.m {
			n += l.left
			l.left = 0
			l.remaining = -1
		}
		sh.mu.Unlock()
	}
	a.owedMu.Lock()
	for _, o := range a.owed {
		n += o.units
	}
	a.owed = nil
	a.owedMu.Unlock()
	a.add(unitsLost, n)
}

// lost reports whether err suggests Redis went away (its state may be
// lost): a connection refused, reset or closed. A timeout (a stall) does
// not: the leases stay, charged.
func lost(err error) bool {
	var oe *net.OpError
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &oe) && oe.Op == "dial"
}

// sweep runs until the store closes: returns expired leases' units, drops
// idle leases, and sends owed refunds again.
func (a *allowances) sweep() {
	defer close(a.done)
	for {
		period := DefaultAllowanceExpiry / 2
		if m := a.zones.Load(); m != nil {
			for _, c := range *m {
				period = min(period, c.expiry/2)
			}
		}
		t := time.NewTimer(period)
		select {
		case <-a.stop:
			t.Stop()
			return
		case <-t.C:
		}
		a.sweepOnce1(time.Now())
	}
}

// sweepOnce1 is one sweep at now.
func (a *allowances) sweepOnce1(now time.Time) {
	cfgs := a.zones.Load()
	var due []owedRefund
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for k, l := range sh.m {
			if l.left > 0 && !now.Before(l.expires) {
				due = append(due, owedRefund{k: k, units: l.left, since: now})
				l.left = 0
			}
			idle := DefaultAllowanceExpiry
			if cfgs != nil {
				if c, ok := (*cfgs)[k.zone]; ok {
					idle = c.expiry
				}
			}
			if l.left == 0 && l.pending == 0 && now.Sub(l.used) > 10*idle {
				delete(sh.m, k)
				a.count.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
	a.owedMu.Lock()
	due = append(due, a.owed...)
	a.owed = nil
	a.owedMu.Unlock()
	if len(due) == 0 {
		return
	}
	var total int64
	for _, o := range due {
		total += o.units
	}
	a.returning.Add(total)
	defer a.returning.Add(-total)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var again []owedRefund
	var dropped int64
	sem := make(chan struct{}, maxRefundsInFlight)
	for _, o := range due {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := a.refund(o)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				a.add(unitsReturned, o.units)
			case retriableRefund(err) && now.Sub(o.since) < refundGiveUp && !lost(err):
				again = append(again, o)
			default:
				dropped += o.units
			}
		}()
	}
	wg.Wait()
	a.add(unitsLost, dropped)
	if len(again) > 0 {
		a.owedMu.Lock()
		a.owed = append(a.owed, again...)
		a.owedMu.Unlock()
	}
}

// refund returns o's units to Redis (the script's refund mode).
func (a *allowances) refund(o owedRefund) error {
	s := a.s
	key := s.Key(o.k.zone, o.k.key)
	if b := s.nodeFor(context.Background(), key).breaker; b != nil && b.state.Load() != circuitClosed {
		return ErrCircuitOpen // the next sweep tries again (a probe is a decision's to make)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	req := []algorithms.Request{{Zone: o.k.zone, Key: o.k.key, Limit: o.k.limit, Cost: o.units}}
	_, err := s.run(ctx, []string{key}, req, nil, true)
	return err
}

// retriableRefund reports whether a refund that failed with err surely did
// not reach Redis, so that sending it again cannot return its units twice:
// it was not sent, the breaker was open, or Redis answered with an error.
func retriableRefund(err error) bool {
	var re interface{ RedisError() }
	return errors.Is(err, errNotSent) || errors.Is(err, ErrCircuitOpen) || errors.As(err, &re) && !errors.As(err, new(*unknownError))
}
