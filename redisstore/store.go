package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/denycache"
	"github.com/sluicehq/caddy-sluice/internal/zonename"
	"github.com/sluicehq/caddy-sluice/stores"
)

// Store decides rate limits in Redis: one script call per request (per
// hash slot when a request's keys span several), with the time read from
// Redis itself, under a tight timeout, through its layers: the local
// allowance, the deny cache and each node's circuit breaker (layers.go).
type Store struct {
	client  redis.UniversalClient
	cluster bool
	prefix  string
	timeout time.Duration

	// one is the node of a standalone or Sentinel store, or a Cluster
	// store's node of last resort; breaker and batch are its. A Cluster
	// store's masters are nodes (node.go), found by key.
	one       *node
	cc        *redis.ClusterClient    // a Cluster's client; nil otherwise
	nodes     atomic.Pointer[[]*node] // the Cluster masters seen
	nodesMu   sync.Mutex              // makes nodes
	reloadAt  atomic.Int64            // monoNow() of the last slot map reload (nodeFailed)
	reloading atomic.Bool             // a reload runs
	masters   map[string]bool         // the masters the last reload saw (under nodesMu)
	breaker   *breaker                // one's; nil: disabled
	deny      *denycache.Cache        // nil: disabled
	denyHits  prometheus.Counter
	unknown   prometheus.Counter // decisions sent whose reply never came (unknownError)
	notSent   prometheus.Counter // decisions not sent within the timeout (errNotSent)
	watch     *watcher           // the deny cache's poll of Redis (watch.go); nil without one
	guard     *promotionGuard    // Sentinel: leaves the old master at the promotion (failover.go); nil otherwise
	opts      storeOptions

	// top is the store's Take, its layers composed (stack, layers.go);
	// call is a node's, below the choice of the node (nodeStack).
	top  stores.Store
	call nodeCall

	batch   *batcher                   // one's: pipelines concurrent script calls (batch.go)
	allowMu sync.Mutex                 // makes allow
	allow   atomic.Pointer[allowances] // the local allowances (allowance.go); nil until a zone has one
	async   atomic.Pointer[syncs]      // the zones in the asynchronous mode (async.go); nil until one is
	argc    argCache
	scripts scripts // FCALL or EVALSHA (function.go)
	// problem is what Redis refused last for want of a permission
	// (perm.go), for the admin API and the live page; nil: none seen.
	problem atomic.Pointer[string]

	// refundsLost counts the refunds that did not reach Redis (refund.go);
	// pins counts the requests that may still call the store (Pin) and
	// the refund calls not yet done: a reload that changes the store's
	// settings keeps it open until there are none (Redis.Cleanup).
	pins atomic.Int64
	// refundDone is refundCallDone, bound once.
	refundsLost prometheus.Counter
	refundDone  func(*call)
	// slots keeps the concurrency zones' held slots (concurrency.go).
	slots *slotKeeper
}

// storeOptions are a store's breaker and deny cache settings and what it
// reports through.
type storeOptions struct {
	Failures    int           // breaker threshold; ≤ 0 disables the breaker
	Cooldown    time.Duration // first cool-down
	MaxCooldown time.Duration // cool-down cap
	DenySize    int           // deny cache entries; ≤ 0 disables it
	Target      string        // for the metrics' target label (no credential)
	Node        string        // for the node label of a standalone or Sentinel store's breaker
	Logger      *zap.Logger   // state changes; nil: none
	Workers     int           // pipeline workers; 0: defaultWorkers
	SyncLanes   int           // pipelines a sync of the asynchronous mode runs at once; 0: syncLanes
	Grace       time.Duration // how long past its deadline a sent call waits for its reply (batch.go)
}

// defaultOptions are the defaults of a Store.
func defaultOptions() storeOptions {
	return storeOptions{Failures: DefaultBreakerFailures, Cooldown: DefaultCooldown, MaxCooldown: DefaultMaxCooldown,
		DenySize: denycache.DefaultSize, Grace: DefaultLateReplyGrace}
}

// newStore wraps a client with the default breaker and deny cache.
func newStore(c redis.UniversalClient, cluster bool, prefix string, timeout time.Duration) *Store {
	return newStoreWith(c, cluster, prefix, timeout, defaultOptions())
}

// newStoreWith wraps a client with the given breaker and deny cache.
func newStoreWith(c redis.UniversalClient, cluster bool, prefix string, timeout time.Duration, o storeOptions) *Store {
	s := &Store{client: c, cluster: cluster, prefix: prefix, timeout: timeout, opts: o, deny: denycache.New(o.DenySize)}
	s.scripts.client = c
	initStoreMetrics()
	s.nodes.Store(new([]*node))
	label := o.Node
	if cc, ok := c.(*redis.ClusterClient); ok {
		s.cc, label = cc, unmappedNode
	}
	s.one = s.newNode(label)
	s.breaker, s.batch = s.one.breaker, s.one.batch
	if s.guard = takeGuard(c); s.guard != nil {
		s.guard.start(o.Logger, s.breaker.probeNow)
	}
	lv := []string{"redis", o.Target}
	s.denyHits = storeMetrics.denyHits.WithLabelValues(lv...)
	s.unknown = storeMetrics.unknownDecisions.WithLabelValues(lv...)
	s.notSent = storeMetrics.notSent.WithLabelValues(lv...)
	s.refundsLost = storeMetrics.refundsLost.WithLabelValues(lv...)
	s.refundDone = s.refundCallDone
	s.slots = newSlotKeeper(s, o.Target)
	if s.deny != nil {
		s.watch = startWatch(s)
	}
	s.stack()
	return s
}

// warm checks that Redis answers and readies the first decision: it loads
// the decision code (function.go) and opens the pipeline pool's
// connections, one per pipeline worker and per spare (on every master of a
// Cluster), so the first burst, or a stall, does not pay a load, nor a
// dial and a handshake per worker, within its timeout.
// Last it runs one decision (probe), so that a permission the user lacks
// is named at load (a *permError).
func (s *Store) warm(ctx context.Context) error {
	if err := s.scripts.prepare(ctx); err != nil {
		return s.noted(err)
	}
	var err error
	switch c := s.client.(type) {
	case *redis.Client:
		err = warmPipelines(ctx, c)
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, warmPipelines)
	}
	if err != nil {
		return err
	}
	return s.noted(s.probe(ctx))
}

// noted returns err, as a *permError when it is one (its text recorded as
// the store's problem: AdminInfo); a nil err clears the problem.
func (s *Store) noted(err error) error {
	if err == nil {
		s.problem.Store(nil)
		return nil
	}
	if pe := s.asPermError(err); pe != nil {
		msg := pe.Error()
		s.problem.Store(&msg)
		return pe
	}
	return err
}

// Problem is what Redis last refused this store for want of a permission
// (it names what to grant), or "" when nothing was.
func (s *Store) Problem() string {
	if p := s.problem.Load(); p != nil {
		return *p
	}
	return ""
}

// warmPipelines fills c's pipeline pool (PipelinePoolSize connections),
// which dials only on use and never keeps idle connections of its own
// accord, so that a first burst does not pay a dial within its timeout
// (docs/redis.md, late replies). It runs that many pipelines at once, and
// a dial hook holds each new connection until the others have dialed too
// (or warmHold passes), so that no pipeline can finish and hand its
// connection to the next before that one dials its own.
func warmPipelines(ctx context.Context, c *redis.Client) error {
	n := max(c.Options().PipelinePoolSize, 1)
	h := &warmHook{}
	c.AddHook(h)
	defer h.b.Store(nil)
	errs := make([]error, n)
	for range 3 {
		st := c.PoolStats().PipelineStats
		if st == nil || int(st.TotalConns) >= n {
			return nil
		}
		h.b.Store(newWarmBarrier(n - int(st.TotalConns)))
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = c.Pipelined(ctx, func(p redis.Pipeliner) error {
					p.Ping(ctx)
					return nil
				})
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return nil
}

// warmHold bounds how long a warm-up dial waits for the others.
const warmHold = 250 * time.Millisecond

// warmHook holds each dial of a warm-up at its barrier; outside a warm-up
// (b nil) it only passes the dial on.
type warmHook struct{ b atomic.Pointer[warmBarrier] }

// warmBarrier opens when n dials have arrived.
type warmBarrier struct {
	n       int32
	arrived atomic.Int32
	all     chan struct{}
}

func newWarmBarrier(n int) *warmBarrier {
	return &warmBarrier{n: int32(n), all: make(chan struct{})}
}

func (h *warmHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if b := h.b.Load(); b != nil && err == nil {
			if b.arrived.Add(1) == b.n {
				close(b.all)
			}
			t := time.NewTimer(warmHold)
			select {
			case <-b.all:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		return conn, err
	}
}

func (h *warmHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *warmHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Destruct closes the client: the last user of a pooled store does it.
func (s *Store) Destruct() error {
	s.allowMu.Lock() // the first local allowance may have started the watch
	w := s.watch
	s.allowMu.Unlock()
	if w != nil {
		w.close()
	}
	if a := s.allow.Load(); a != nil {
		a.close() // returns the leases' units, through the workers
	}
	if y := s.async.Load(); y != nil {
		y.close() // sends what it holds
	}
	for _, n := range *s.nodes.Load() {
		n.close(s.opts.Target)
	}
	s.one.close(s.opts.Target)
	s.slots.close()
	if s.guard != nil {
		s.guard.close()
	}
	return s.client.Close()
}

// allowForget drops the local allowances' leases (Redis's state may be
// lost; allowance.go).
func (s *Store) allowForget() {
	s.allow.Load().forget()
}

// CircuitState is the breaker's state: "closed", "half-open", "open", or
// "disabled" (for tests and the admin API); in a Cluster, the least
// healthy of its nodes' (Nodes tells each).
func (s *Store) CircuitState() string {
	worst := int32(-1)
	for _, n := range s.allNodes() {
		if n.breaker != nil {
			worst = max(worst, n.breaker.state.Load())
		}
	}
	if worst < 0 {
		return "disabled"
	}
	return stateNames[worst]
}

// DenyCache is the store's deny cache (nil when disabled).
func (s *Store) DenyCache() *denycache.Cache { return s.deny }

// Client returns the underlying client (for tests and the admin API).
func (s *Store) Client() redis.UniversalClient { return s.client }

// Key returns the Redis key of one zone's state for one identity:
// <prefix><zone>:{<token>}. The token's text uses only [0-9a-z-] and the
// zone name is percent-encoded outside [A-Za-z0-9_.-] (zonename.AppendKey:
// a name of those characters only, as every name once had to be, is its
// own encoding, so existing keys are unchanged), so neither a zone name nor
// a client-controlled value can break the Cluster hash tag or make one
// zone's key collide with another's.
func (s *Store) Key(zone string, key algorithms.Key) string {
	var buf [256]byte
	return string(s.appendKey(buf[:0], zone, key))
}

// appendKey appends the key of Key to b.
func (s *Store) appendKey(b []byte, zone string, key algorithms.Key) []byte {
	b = append(b, s.prefix...)
	if _, enc := zonename.KeyLen(zone); enc {
		b = zonename.AppendKey(b, zone)
	} else {
		b = append(b, zone...)
	}
	b = append(b, ":{"...)
	b = key.AppendText(b)
	return append(b, '}')
}

// Take decides reqs in Redis. Either every request is allowed and all are
// charged, or none is charged. Any failure (timeout, connection, NOSCRIPT
// twice, READONLY, OOM, an unexpected reply) is returned as an error for the
// zones' fail policy; the decision never waits longer than the timeout, plus
// the late-reply grace once it was sent (batch.go). In a Cluster, a request
// spanning shards with one down may be decided in part
// (algorithms.PartialError: takeAcrossHashSlots).
//
// Before Redis (the layers, layers.go): a local allowance may decide it,
// the deny cache may answer a refusal locally (the request's
// keys refused moments ago: their states, run forward, still refuse it; see
// package denycache), and an open circuit breaker returns an error wrapping
// ErrCircuitOpen at once. Every error names its kind (StoreErrorKind, see
// storeError) for the handler's metrics.
func (s *Store) Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
	if len(reqs) == 0 {
		return nil
	}
	return s.top.Take(ctx, reqs, out)
}

// takeNodes is the bottom of the store's stack (layers.go): every zone
// decided by Redis, on the node of its key, and a refusal's states given
// to the deny cache (the script's reply carries them).
func (s *Store) takeNodes(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
	now := time.Now() // one reading: the decision's deadline, the deny cache's start
	var start int64
	var tok denycache.Token
	var ref *refusal // a refusal's states, for the deny cache (armed only)
	if s.deny != nil {
		start, tok = denycache.At(now), s.deny.Token()
		if tok != 0 {
			ref = getRefusal()
			defer putRefusal(ref)
		}
	}
	deadline := now.Add(s.timeout)
	var err error
	var fast bool
	if !s.cluster || inOneHashSlot(reqs) {
		// The pipeline workers bound the wait by c.deadline themselves.
		c := getCall(ctx, deadline)
		c.fresh = true
		c.setKeys(s, reqs)
		err = s.call(s.nodeFor(ctx, c.key0()), c, reqs, out, ref)
		fast = failedFast(err)
	} else {
		dctx, cancel := context.WithDeadlineCause(ctx, deadline, errDecisionDeadline)
		keys := make([]string, len(reqs))
		for i := range reqs {
			keys[i] = s.keyOf(&reqs[i])
		}
		var failed []bool
		fast, failed, err = s.takeAcrossHashSlots(dctx, keys, reqs, out)
		cancel()
		if failed != nil {
			return s.partial(ctx, reqs, out, failed, err)
		}
	}
	if fast {
		return err // an open breaker's: as it is, nothing to account
	}
	if err != nil {
		return s.takeFailed(ctx, reqs, err)
	}
	s.slots.admitted(reqs, out)
	if ref != nil && ref.raws != nil {
		s.remember(tok, start, reqs, out, ref)
	}
	if s.problem.Load() != nil {
		s.problem.Store(nil) // the permission was granted
	}
	return nil
}

// takeFailed accounts for a Take of reqs that failed with err (not by an
// open breaker) and returns the error to report.
func (s *Store) takeFailed(ctx context.Context, reqs []algorithms.Request, err error) error {
	// The caller gone (its context done first) says nothing about Redis.
	abandoned := ctx.Err() != nil
	failed := !abandoned && counts(err)
	switch {
	case abandoned:
	case errors.Is(err, errNotSent):
		s.notSent.Inc()
	case errors.As(err, new(*unknownError)):
		s.unknown.Inc()
	}
	if failed && !isOOM(err) {
		// State may be lost (a restart breaks the pooled connections):
		// forget every denial. Not for OOM: Redis refused to write, its
		// state stands, and the cache keeps refusing what it refuses.
		s.deny.Clear()
		if lost(err) {
			s.allowForget()
		}
	}
	s.slots.undecided(reqs, err, abandoned)
	if pe := s.asPermError(err); pe != nil {
		if s.problem.Load() == nil {
			s.noted(pe)
		}
		err = pe
	}
	return &storeError{err}
}

// partial accounts for a request decided in part (takeAcrossHashSlots): the
// leases of the zones decided are kept, those of the zones that failed
// handled as a failed Take's; err is the failed hash slots' error.
func (s *Store) partial(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision, failed []bool, err error) error {
	var done, undone []algorithms.Request
	var dout []algorithms.Decision
	for i := range reqs {
		if failed[i] {
			undone = append(undone, reqs[i])
		} else {
			done, dout = append(done, reqs[i]), append(dout, out[i])
		}
	}
	s.slots.admitted(done, dout)
	if _, open := err.(*circuitError); !open {
		err = s.takeFailed(ctx, undone, err)
	}
	return &algorithms.PartialError{Err: err, Failed: failed}
}

// errDecisionDeadline ends the context of a decision across slots at its
// timeout: a call ended by it failed, its caller did not go away.
var errDecisionDeadline = errors.New("redis: decision timeout")

// denied answers reqs from the deny cache when it can: exactly as Redis
// would at this moment, nothing charged (package denycache). It reports
// whether it answered.
func (s *Store) denied(reqs []algorithms.Request, out []algorithms.Decision) bool {
	if s.cluster && len(reqs) > 1 && !inOneHashSlot(reqs) {
		// Decided hash slot by hash slot, never from the cache; and it may charge
		// the zones.
		s.deny.Drop(reqs)
		return false
	}
	if !s.deny.Decide(reqs, denycache.Now(), out) {
		return false
	}
	s.denyHits.Inc()
	return true
}

// refusal is what the script adds to a refusal's reply for the deny
// cache: Redis's time of the decision and each zone's stored value
// (lua/take.lua).
type refusal struct {
	now  int64
	raws []any // per zone: a string, or 0 when Redis did not send it
}

// refusals recycles refusals: one passes through the node's layers, so it
// would escape to the heap at every decision.
var refusals = sync.Pool{New: func() any { return new(refusal) }}

func getRefusal() *refusal { return refusals.Get().(*refusal) }

func putRefusal(r *refusal) {
	*r = refusal{}
	refusals.Put(r)
}

// remember stores a refusal's states in the deny cache (tok and start were
// taken before the call began).
func (s *Store) remember(tok denycache.Token, start int64, reqs []algorithms.Request, out []algorithms.Decision, ref *refusal) {
	var buf [4]denycache.Snapshot
	snaps := buf[:0]
	if len(reqs) > len(buf) {
		snaps = make([]denycache.Snapshot, 0, len(reqs))
	}
	for i := range reqs {
		var sn denycache.Snapshot
		if raw, ok := ref.raws[i].(string); ok {
			st, ok := DecodeState(raw)
			sn = denycache.Snapshot{State: st, Fresh: !ok, Known: true}
		}
		snaps = append(snaps, sn)
	}
	s.deny.Remember(tok, start, ref.now, reqs, out, snaps)
}

// inOneHashSlot reports whether the keys of reqs live in one Cluster hash
// slot, without building them (hashSlotOf).
func inOneHashSlot(reqs []algorithms.Request) bool {
	first := hashSlotOf(reqs[0].Key)
	for i := 1; i < len(reqs); i++ {
		if reqs[i].Key != reqs[0].Key && hashSlotOf(reqs[i].Key) != first {
			return false
		}
	}
	return true
}

// run evaluates the script once for keys/reqs (all in one hash slot) on
// their node: a decision through the node's layers (s.call), a refund past
// them.
func (s *Store) run(ctx context.Context, keys []string, reqs []algorithms.Request, out []algorithms.Decision, refund bool) (fast bool, err error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(s.timeout)
	}
	c := getCall(ctx, deadline)
	c.setKeyStrings(keys)
	n := s.nodeFor(ctx, keys[0])
	if refund {
		return false, s.runCall(n.batch, c, reqs, out, refund, nil)
	}
	err = s.call(n, c, reqs, out, nil)
	return failedFast(err), err
}

// runCall evaluates the script once for c's keys (all in one hash slot) and
// reqs, through the pipeline workers b, and decodes the reply into out
// (nothing for a refund), and a refusal's states into ref when it is not
// nil. It consumes c.
func (s *Store) runCall(b *batcher, c *call, reqs []algorithms.Request, out []algorithms.Decision, refund bool, ref *refusal) error {
	c.addArgsBy(len(reqs), func(b []byte, i int) []byte { return s.argc.appendTake(b, &reqs[i], refund) })
	if owned, err := b.do(c); err != nil {
		if owned {
			putCall(c)
		}
		return err
	}
	var err error
	if c.cmd == c.raw {
		err = c.cmd.Err()
		if err == nil {
			err = decodeRaw(c.reply.b, reqs, out, refund, ref)
		}
	} else {
		err = decodeReply(c.cmd.(*redis.Cmd), &c.reply, reqs, out, refund, ref)
	}
	if err != nil && unanswered(c.cmd.Err()) {
		// Sent (the worker had it), and no reply came: Redis may have
		// decided it.
		err = &unknownError{err: err}
	}
	putCall(c)
	return err
}

// unanswered reports whether a sent call's error leaves its decision
// unknown: the command may have reached Redis and no reply came (a read
// timeout, a connection lost after the write). Not so for a reply from
// Redis (an error reply decides nothing), for failures before anything is
// written (a dial, the pool, a closed client), nor for a library load that
// failed before the call was sent again (function.go).
func unanswered(err error) bool {
	var oe *net.OpError
	switch {
	case err == nil, errors.As(err, new(redis.Error)), errors.As(err, new(*loadError)), errors.As(err, new(*tlsError)),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted), errors.Is(err, redis.ErrClosed),
		errors.As(err, &oe) && oe.Op == "dial":
		return false
	}
	return true
}

// decodeReply reads the reply of a typed command (a call sent again:
// function.go) with decodeRaw, the one reader of the script's reply, after
// writing it back as RESP into buf, the call's reply buffer; only these
// calls, rare, pay for it.
func decodeReply(cmd *redis.Cmd, buf *replyBuf, reqs []algorithms.Request, out []algorithms.Decision, refund bool, ref *refusal) error {
	v, err := cmd.Result()
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return errors.New("redis: the script returned nil")
		}
		return err
	}
	if refund {
		return nil
	}
	buf.b = appendRESP(buf.b[:0], v)
	return decodeRaw(buf.b, reqs, out, refund, ref)
}

// zoneDecision is one zone's decision from its four numbers in the
// script's reply: allowed (1/0; 2: refused, resting on charges in flight),
// remaining, retry-after and reset-after
// in ms. An admission's retry-after is its wait (lua/take.lua: delay).
// An override's decision adds 4 × (its capacity + 1) to allowed
// (lua/take.lua, override.go).
func zoneDecision(r *algorithms.Request, n [replyPerZone]int64) algorithms.Decision {
	limit, overridden := r.Limit.Capacity(), false
	if n[0] >= 4 {
		limit, overridden = n[0]/4-1, true
		n[0] %= 4
	}
	d := algorithms.Decision{
		Allowed:    n[0] == 1,
		InFlight:   n[0] == 2, // refused, resting on charges in flight
		Overridden: overridden,
		Limit:      limit,
		Remaining:  n[1],
		ResetAfter: time.Duration(n[3]) * time.Millisecond,
	}
	if d.Allowed {
		d.Delay = time.Duration(n[2]) * time.Millisecond
	} else {
		d.RetryAfter = time.Duration(n[2]) * time.Millisecond
	}
	return d
}

// decodeRaw reads the script's reply from its raw RESP bytes (resp.go)
// without allocating (a refusal's stored values excepted): per zone,
// allowed (1/0), remaining, retry-after and reset-after in ms; after them,
// on a refusal, Redis's time and each zone's stored value, kept in ref when
// it is not nil; or, on an admission with a refundable zone, Redis's time
// alone. Redis's time, when the reply has it, is every decision's At. One
// zone allowed with no wait comes as one integer instead (decodePacked).
func decodeRaw(b []byte, reqs []algorithms.Request, out []algorithms.Decision, refund bool, ref *refusal) error {
	if len(b) > 0 && b[0] == ':' && !refund {
		return decodePacked(b, reqs, out) // one zone allowed with no wait
	}
	r := respReader{b: b}
	n, err := r.arrayLen()
	_, typed := err.(*typeError)
	switch {
	case refund && typed:
		return nil // a refund's reply says nothing
	case err != nil:
		return err
	case n == -1:
		return errors.New("redis: the script returned nil")
	case refund:
		return nil
	}
	if z := replyPerZone * len(reqs); n != z && n != z+1 && n != z+1+len(reqs) {
		return fmt.Errorf("redis: the script returned %d values for %d zones", n, len(reqs))
	}
	var v [replyPerZone]int64
	for i := range reqs {
		for j := range v {
			if v[j], err = r.integer(); err != nil {
				return err
			}
		}
		out[i] = zoneDecision(&reqs[i], v)
	}
	z := replyPerZone * len(reqs)
	if n == z {
		return nil
	}
	now, err := r.integer()
	if err != nil {
		return nil // no instant, no states for the deny cache
	}
	for i := range reqs {
		out[i].At = now
	}
	if ref != nil && n == z+1+len(reqs) {
		raws := make([]any, len(reqs))
		for i := range raws {
			if raws[i], err = r.value(); err != nil {
				return nil
			}
		}
		ref.now, ref.raws = now, raws
	}
	return nil
}

// takeAcrossHashSlots decides a request whose keys live in several Cluster
// slots: one script per hash slot, all at once (a hash slot's shard stalled costs the
// others no wait, nor their deadline). When a hash slot refuses, the slots
// charged are refunded. Between a charge and its refund (one round trip) a
// concurrent request may see those zones charged: the only window in which
// a multi-zone decision is not atomic.
//
// A hash slot that fails (its node's breaker open, or the call failing): when
// every zone of the failed hash slots is FailApart and another hash slot decided, the
// decided zones stand and failed marks the others (PartialError, see
// docs/redis.md); otherwise the hash slots charged are refunded and the request
// fails as a whole (fast: every failure was an open breaker's). A refusal
// by a decided hash slot refuses the request whatever failed.
func (s *Store) takeAcrossHashSlots(ctx context.Context, keys []string, reqs []algorithms.Request, out []algorithms.Decision) (fast bool, failed []bool, err error) {
	// out may hold a previous request's decisions (callers reuse it), and
	// zones in hash slots that failed must not report them.
	clear(out[:len(reqs)])
	groups := groupByHashSlot(reqs)
	if err := s.failFastBeforeCharging(ctx, keys, reqs, groups); err != nil {
		return true, nil, err
	}
	runs := s.runHashSlots(ctx, keys, reqs, groups)
	var charged [][]int
	refused, whole, decided := false, false, false
	fast = true
	for g := range runs {
		r := &runs[g]
		if r.err != nil {
			if err == nil || fast && !r.fast {
				err = r.err // a call's failure rather than an open breaker's
			}
			fast = fast && r.fast
			if failed == nil {
				failed = make([]bool, len(reqs))
			}
			for _, i := range r.idx {
				failed[i] = true
				whole = whole || !reqs[i].FailApart
			}
			continue
		}
		decided = true
		// Only the zones that allowed were charged (a report-only zone that
		// would refuse was not).
		var got []int
		for j, i := range r.idx {
			out[i] = r.out[j]
			refused = refused || !r.out[j].Allowed && !reqs[i].ReportOnly
			if r.out[j].Allowed {
				got = append(got, i)
			}
		}
		if len(got) > 0 {
			charged = append(charged, got)
		}
	}
	switch {
	case refused:
		s.refund(keys, reqs, charged)
		// The zones charged and refunded report what they had before.
		for _, idx := range charged {
			for _, i := range idx {
				out[i].Remaining += reqs[i].Cost
			}
		}
		// Zones of hash slots that failed are reported as allowed with no
		// numbers; the refusal comes from another zone.
		for i := range reqs {
			if failed != nil && failed[i] {
				out[i] = algorithms.Decision{Allowed: true, Limit: reqs[i].Limit.Capacity(), Remaining: reqs[i].Limit.Capacity()}
			}
		}
		return false, nil, nil
	case failed == nil:
		return false, nil, nil
	case whole || !decided:
		s.refund(keys, reqs, charged)
		return fast, nil, err
	}
	return false, failed, err
}

// groupByHashSlot returns the indexes of reqs by their key's hash slot,
// the hash slots in the order of their first zone.
func groupByHashSlot(reqs []algorithms.Request) [][]int {
	at := map[uint16]int{}
	var groups [][]int
	for i := range reqs {
		sl := hashSlotOf(reqs[i].Key)
		g, ok := at[sl]
		if !ok {
			g = len(groups)
			at[sl] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// failFastBeforeCharging fails the request before any hash slot is charged
// when a hash slot's node's breaker fails it at once and the slot's zones
// are not all FailApart.
func (s *Store) failFastBeforeCharging(ctx context.Context, keys []string, reqs []algorithms.Request, groups [][]int) error {
	for _, idx := range groups {
		if !anyNotFailApart(reqs, idx) {
			continue
		}
		if n := s.nodeFor(ctx, keys[idx[0]]); n.breaker.failsFast() {
			probe, err := n.breaker.allow()
			if err != nil {
				s.nodeFailed(n)
				return err
			}
			n.breaker.done(probe, false, true, nil) // the cool-down just ended: the call below probes
		}
	}
	return nil
}

// hashSlotRun is one hash slot's part of a request across hash slots:
// its zones (indexes into the request), their decisions and how the call
// ended.
type hashSlotRun struct {
	idx  []int
	out  []algorithms.Decision
	fast bool
	err  error
}

// runHashSlots decides each hash slot's zones in a call of its own, all
// at once (the last in this goroutine).
func (s *Store) runHashSlots(ctx context.Context, keys []string, reqs []algorithms.Request, groups [][]int) []hashSlotRun {
	runs := make([]hashSlotRun, len(groups))
	var wg sync.WaitGroup
	for g, idx := range groups {
		r := &runs[g]
		r.idx = idx
		r.out = make([]algorithms.Decision, len(r.idx))
		gk, gr := subset(keys, reqs, r.idx)
		if g == len(groups)-1 {
			r.fast, r.err = s.run(ctx, gk, gr, r.out, false) // the last in this goroutine
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.fast, r.err = s.run(ctx, gk, gr, r.out, false)
		}()
	}
	wg.Wait()
	return runs
}

// anyNotFailApart reports whether a zone of reqs at idx is not FailApart.
func anyNotFailApart(reqs []algorithms.Request, idx []int) bool {
	for _, i := range idx {
		if !reqs[i].FailApart {
			return true
		}
	}
	return false
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
		_, _ = s.run(ctx, gk, gr, nil, true)
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
