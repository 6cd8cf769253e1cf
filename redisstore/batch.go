package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Pipelining: concurrent decisions share round trips. A node's workers
// each take the first waiting call and every call queued behind it (up to
// maxPipeline), send them as one pipeline and wake each caller with its own
// reply; an idle worker sends a lone call at once. A queued call is either
// sent (marked by the worker) or abandoned (marked by its caller at its
// deadline): one compare-and-swap decides, so exactly one side knows
// whether the command left. A sent call's caller waits up to the grace for
// its reply; past it the decision is unknown (unknownError). A call still
// queued halfway to its deadline starts a spare sender (spare). How and
// why: docs/redis.md, "The pipeline workers".

const (
	// maxPipeline bounds one pipeline (the write buffer and Redis's reply
	// buffer grow with it; beyond a few dozen calls the round trip is no
	// longer the cost).
	maxPipeline = 64
	// defaultWorkers is the number of pipelines in flight per store (the
	// store option pipelines). Measured (BenchmarkTakeModes, go test -bench
	// TakeModes ./redisstore/, and make bench): see docs/performance.md.
	defaultWorkers = 2
	// maxWorkers bounds the option.
	maxWorkers = 64
	// queueSize bounds the calls waiting for a worker; a caller that finds
	// it full waits for room within its own deadline.
	queueSize = 4096
)

// call is one script evaluation travelling through a batcher.
type call struct {
	ctx      context.Context // the caller's: its end (client gone) ends the wait
	deadline time.Time       // the decision's: its caller gives up on a call not sent by then
	timer    *time.Timer     // fires at deadline, then at the grace's end; kept with the call, no allocation per wait
	// argv is the script call as sent: the command and the function (or
	// the script's SHA), set by the sender; the number of keys; the keys
	// (bytes of keyb, or strings); then the arguments (bytes of argb, or
	// strings). Kept with the call, so a decision builds it without
	// allocating.
	argv  []any
	nkeys int
	keyb  []byte
	// keys are the keys of argv, as strings over keyb's bytes; argv holds
	// pointers to them (a string or a slice in an interface would be
	// copied to the heap; a pointer is not).
	keys [maxCallKeys]string
	// argb and zargs are the same for the script's arguments, one per zone
	// (argCache).
	argb  []byte
	zargs [maxCallKeys]string
	reply replyBuf             // the reply's raw RESP (resp.go)
	raw   *redis.RawWriteToCmd // copies the reply into reply; reused while argv keeps its array and length
	cmd   redis.Cmder          // as sent: raw, or a typed command sent again (function.go's retry)
	done  chan struct{}        // capacity 1: a worker never blocks on it
	state atomic.Int32         // callQueued → callSent (a worker) or callAbandoned (its caller)
	// fresh: deadline is the timeout from a moment ago (Take's), so the
	// nudge is half the timeout from now without reading the clock again.
	fresh bool
	// onDone, when set, makes the call asynchronous (post): no caller
	// waits; the worker calls it (c.cmd is the reply, nil when the call was
	// never sent) and puts the call back in the pool.
	onDone func(c *call)
}

// argvHead is the room argv keeps for the command, the function and the
// number of keys.
const argvHead = 3

// numKeysArgs are the script's numkeys argument for small counts, so that
// a call formats nothing.
var numKeysArgs = func() (a [17]any) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return
}()

func numKeysArg(n int) any {
	if n < len(numKeysArgs) {
		return numKeysArgs[n]
	}
	return strconv.Itoa(n)
}

// maxCallKeys is the most keys (and zones' arguments) a call carries
// without allocating them.
const maxCallKeys = 8

// setKeys starts c's argv with the keys of reqs (appendZoneKey).
func (c *call) setKeys(s *Store, reqs []algorithms.Request) {
	c.setKeysBy(len(reqs), func(b []byte, i int) []byte {
		return s.appendZoneKey(b, reqs[i].Zone, reqs[i].Key, reqs[i].Limit.Algorithm)
	})
}

// setKeysBy starts c's argv with n keys, the i-th appended to a buffer by
// key(b, i) (appendBuilt, over keyb).
func (c *call) setKeysBy(n int, key func(b []byte, i int) []byte) {
	c.argv = append(c.argv[:0], nil, nil, numKeysArg(n))
	c.nkeys = n
	c.appendBuilt(&c.keyb, &c.keys, n, key)
}

// addArgsBy appends n script arguments to c's argv, the i-th appended to a
// buffer by arg(b, i) (appendBuilt, over argb): argCache's writers.
func (c *call) addArgsBy(n int, arg func(b []byte, i int) []byte) {
	c.appendBuilt(&c.argb, &c.zargs, n, arg)
}

// appendBuilt appends n strings to c's argv, the i-th appended to *buf by
// f(b, i).
//
// The strings are strs's, over buf's bytes (unsafe.String), so building
// them copies nothing: buf is not written again until the call is reused,
// by which time go-redis has written the command, and nothing keeps the
// strings (function.go's retry, which sends a typed command, copies the
// keys; the arguments it sends as they are, before the call is reused).
// f does not escape: a closure passed here is not allocated.
func (c *call) appendBuilt(buf *[]byte, strs *[maxCallKeys]string, n int, f func(b []byte, i int) []byte) {
	if n > maxCallKeys { // rare: so many zones' strings are strings of their own
		for i := range n {
			c.argv = append(c.argv, string(f(nil, i)))
		}
		return
	}
	b := (*buf)[:0]
	var ends [maxCallKeys]int
	for i := range n {
		b = f(b, i)
		ends[i] = len(b)
	}
	*buf = b
	from := 0
	for i, end := range ends[:n] {
		strs[i] = unsafe.String(&b[from], end-from)
		c.argv = append(c.argv, &strs[i])
		from = end
	}
}

// setKeyStrings starts c's argv with keys.
func (c *call) setKeyStrings(keys []string) {
	c.argv = append(c.argv[:0], nil, nil, numKeysArg(len(keys)))
	for _, k := range keys {
		c.argv = append(c.argv, k)
	}
	c.nkeys = len(keys)
}

// keyStrings returns c's keys as strings of their own (for a typed command
// sent again).
func (c *call) keyStrings() []string {
	ks := make([]string, c.nkeys)
	for i := range ks {
		switch k := c.argv[argvHead+i].(type) {
		case string:
			ks[i] = k
		case *string:
			ks[i] = strings.Clone(*k)
		}
	}
	return ks
}

// key0 returns c's first key (its hash slot is every key's), without copying it.
func (c *call) key0() string {
	switch k := c.argv[argvHead].(type) {
	case string:
		return k
	case *string:
		return *k
	}
	return ""
}

// args returns c's script arguments.
func (c *call) args() []any { return c.argv[argvHead+c.nkeys:] }

// rawCmd returns the command that sends c's argv and copies the reply into
// c.reply: the call's own, when it still covers argv (a standalone or
// Sentinel store; a Cluster client may remember a command's hash slot, so there
// every send gets a new command).
func (c *call) rawCmd(reuse bool) *redis.RawWriteToCmd {
	c.reply.b = c.reply.b[:0]
	if reuse && c.raw != nil {
		if a := c.raw.Args(); len(a) == len(c.argv) && &a[0] == &c.argv[0] {
			c.raw.SetErr(nil)
			return c.raw
		}
	}
	c.raw = redis.NewRawWriteToCmd(context.Background(), &c.reply, c.argv...)
	return c.raw
}

// A call's states (call.state).
const (
	callQueued int32 = iota
	callSent
	callAbandoned
)

// errNotSent is the error of a call whose deadline passed before a worker
// sent it (the pipelines were busy, or this process was short of CPU):
// Redis decided nothing, nothing was charged.
var errNotSent = fmt.Errorf("redis: decision not sent within the timeout (pipelines busy or this process short of CPU): %w", context.DeadlineExceeded)

// unknownError is the error of a call that was sent but whose reply did
// not come within the deadline and the grace (or came as a connection
// error): Redis may have decided it, charged or not, and this instance
// cannot know. The zones' fail policy applies; Store.Take counts it.
type unknownError struct{ err error }

func (e *unknownError) Error() string {
	return "redis: no reply to a sent decision (decision unknown): " + e.err.Error()
}

func (e *unknownError) Unwrap() error { return e.err }

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{done: make(chan struct{}, 1), timer: t}
}}

// getCall returns an empty call from the pool for a decision ending at
// deadline.
func getCall(ctx context.Context, deadline time.Time) *call {
	c := callPool.Get().(*call)
	c.ctx, c.deadline, c.fresh = ctx, deadline, false
	c.state.Store(callQueued)
	return c
}

// putCall returns a call whose worker is done with it (its done was
// received, or it was never queued) to the pool. A call whose caller
// stopped waiting is never put back: its worker may still use it.
func putCall(c *call) {
	clear(c.argv)
	clear(c.keys[:])
	clear(c.zargs[:])
	c.argv, c.nkeys = c.argv[:0], 0
	c.ctx, c.cmd, c.onDone = nil, nil, nil
	if cap(c.reply.b) > 64<<10 {
		c.reply.b = nil // a long sliding log's reply: do not keep it
	}
	callPool.Put(c)
}

// batcher runs script calls through pipeline workers.
type batcher struct {
	client  redis.UniversalClient
	cluster bool // a Cluster client: a command is not reused (rawCmd)
	scripts *scripts
	timeout time.Duration // the decisions': a call queued for half of it starts a spare
	grace   time.Duration // how long past its deadline a sent call waits for its reply
	workers int
	spares  atomic.Int32       // spare senders running
	late    prometheus.Counter // replies that came past the deadline and decided; set by the store
	queue   chan *call
	stop    chan struct{}
	wg      sync.WaitGroup
}

func newBatcher(client redis.UniversalClient, cluster bool, sc *scripts, workers int, timeout, grace time.Duration) *batcher {
	if workers <= 0 {
		workers = defaultWorkers
	}
	b := &batcher{client: client, cluster: cluster, scripts: sc, timeout: timeout, grace: max(grace, 0), workers: workers, queue: make(chan *call, queueSize), stop: make(chan struct{})}
	b.wg.Add(workers)
	for range workers {
		go b.work()
	}
	return b
}

// close stops the workers. A call still queued ends with its deadline.
func (b *batcher) close() {
	close(b.stop)
	b.wg.Wait()
}

// do sends c and waits for its reply, its deadline or the end of its
// context; a call sent before its deadline waits up to the grace more for
// its reply. On a nil error the reply is c's (c.cmd, c.reply) and c is the
// caller's again.
// A sent call that got no reply in time fails with an *unknownError.
// owned reports whether the caller may reuse c: false when it stopped
// waiting while a worker may still hold c. The wait uses the call's own
// timer, not a context per decision (which would also register with the
// request's context: a lock and a map entry each time). A call still
// queued halfway to its deadline starts a spare sender (spare).
func (b *batcher) do(c *call) (owned bool, err error) {
	nudge := c.deadline.Add(-b.timeout / 2)
	if c.fresh {
		c.timer.Reset(b.timeout / 2) // a few µs late at most
	} else {
		c.timer.Reset(time.Until(nudge))
	}
	for queued := false; !queued; {
		select {
		case b.queue <- c:
			queued = true
		case <-c.timer.C:
			if nudge.IsZero() {
				return true, errNotSent
			}
			nudge = time.Time{}
			c.timer.Reset(time.Until(c.deadline))
		case <-c.ctx.Done():
			c.timer.Stop()
			return true, c.ctx.Err()
		}
	}
	for {
		select {
		case <-c.done:
			c.timer.Stop()
			return true, nil
		case <-c.timer.C:
		case <-c.ctx.Done():
			c.timer.Stop()
			return false, c.ctx.Err()
		}
		if nudge.IsZero() {
			break
		}
		nudge = time.Time{}
		if c.state.Load() == callQueued {
			b.spare()
		}
		c.timer.Reset(time.Until(c.deadline))
	}
	// The deadline passed. A call never sent decided nothing.
	if c.state.CompareAndSwap(callQueued, callAbandoned) || c.state.Load() == callAbandoned {
		return false, errNotSent
	}
	// Sent: Redis decides, if its reply comes within the grace (it may
	// already be here: a process starved of CPU wakes its timers and its
	// network at once).
	if b.grace > 0 {
		c.timer.Reset(time.Until(c.deadline.Add(b.grace)))
		select {
		case <-c.done:
			c.timer.Stop()
			b.late.Inc()
			return true, nil
		case <-c.timer.C:
		case <-c.ctx.Done():
			c.timer.Stop()
			return false, c.ctx.Err()
		}
	} else {
		select {
		case <-c.done:
			b.late.Inc()
			return true, nil
		default:
		}
	}
	return false, &unknownError{err: context.DeadlineExceeded}
}

// spare sends, once, the calls queued behind workers that are all in a
// round trip: a worker waits for its whole batch's reply before it sends
// again, so when Redis or this process stalls, every call queued behind
// the stalled batches would otherwise reach its deadline unsent and fail
// open, though Redis answers them as late as the batches in flight, within
// the grace. At most as many spares as workers run at once; a spare's
// pipeline takes a free pipeline connection or spills to the main pool.
func (b *batcher) spare() {
	if b.spares.Add(1) > int32(b.workers) {
		b.spares.Add(-1)
		return
	}
	go func() {
		defer b.spares.Add(-1)
		batch := make([]*call, 0, maxPipeline)
		for len(batch) < maxPipeline {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				b.exec(batch, b.newSender())
				return
			}
		}
		b.exec(batch, b.newSender())
	}()
}

func (b *batcher) work() {
	defer b.wg.Done()
	batch := make([]*call, 0, maxPipeline)
	snd := b.newSender()
	for {
		select {
		case <-b.stop:
			return
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
	drain:
		for len(batch) < maxPipeline {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		b.exec(batch, snd)
		clear(batch)
	}
}

// sender is what a worker (or a spare) keeps from batch to batch: the
// context that carries a batch's deadline to go-redis, and a pipeline
// (go-redis empties it at Exec; a new one would cost four allocations per
// batch).
type sender struct {
	ctx  deadlineCtx
	pipe redis.Pipeliner
}

func (b *batcher) newSender() *sender { return &sender{pipe: b.client.Pipeline()} }

// exec sends one batch as a pipeline and wakes every caller. Calls their
// callers abandoned are left alone (their callers have gone), as are calls
// whose context ended or whose deadline and grace passed while queued.
func (b *batcher) exec(batch []*call, snd *sender) {
	var deadline time.Time
	now := time.Now()
	live := batch[:0]
	for _, c := range batch {
		if c.ctx.Err() != nil || !now.Before(c.deadline.Add(b.grace)) || !c.state.CompareAndSwap(callQueued, callSent) {
			if c.onDone != nil {
				c.onDone(c)
				putCall(c)
			}
			continue
		}
		if c.deadline.After(deadline) {
			deadline = c.deadline
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx, pipe := &snd.ctx, snd.pipe
	ctx.deadline = deadline.Add(b.grace)
	name, fn := b.scripts.command()
	for _, c := range live {
		c.argv[0], c.argv[1] = name, fn // boxed once (function.go)
		c.cmd = c.rawCmd(!b.cluster)
		_ = pipe.Process(ctx, c.cmd)
	}
	_, _ = pipe.Exec(ctx) // each call's error is on its own command
	// A Redis that lost the code (restart, FUNCTION or SCRIPT FLUSH,
	// failover to a node without it) answers so: load it, send those
	// calls again; as does a Cluster node that no longer owns the hash slot
	// (MOVED, ASK: go-redis follows the redirect of the typed command
	// sent again).
	// A Redis out of memory refuses the function before it runs: a
	// refusal is decided again read-only (function.go, readOnly).
	var again redis.Pipeliner
	var load libLoad
	var oom []oomCall
	for _, c := range live {
		err := c.replyErr()
		retry := err != nil && b.scripts.retriable(err)
		if !retry && !b.scripts.readOnlyFor(err) {
			continue
		}
		if again == nil {
			again = b.client.Pipeline()
		}
		if retry {
			b.scripts.retry(ctx, again, c, err, &load)
		} else {
			b.scripts.readOnly(ctx, again, c)
			oom = append(oom, oomCall{c, err})
		}
	}
	if again != nil && again.Len() > 0 {
		_, _ = again.Exec(ctx)
	}
	for _, o := range oom {
		readOnlyFailed(ctx, o.c, o.err)
	}
	for _, c := range live {
		if c.onDone != nil {
			c.onDone(c)
			putCall(c)
			continue
		}
		c.done <- struct{}{}
	}
}

// oomCall is a call sent again read-only, and the OOM error it had.
type oomCall struct {
	c   *call
	err error
}

// replyErr returns the error of c's reply as it came: a transport error,
// or Redis's error reply; nil for a reply to decode.
func (c *call) replyErr() error {
	if err := c.cmd.Err(); err != nil || c.cmd != c.raw {
		return err
	}
	if len(c.reply.b) > 0 && (c.reply.b[0] == '-' || c.reply.b[0] == '!') {
		r := respReader{b: c.reply.b}
		t, body, err := r.line()
		if err != nil {
			return err
		}
		return r.errorReply(t, body)
	}
	return nil
}

// deadlineCtx is the context a sender hands go-redis for one batch: only
// a deadline (the latest of the batch's calls' plus the grace), which
// go-redis turns into the connection's read and write deadlines
// (ContextTimeoutEnabled). It is never cancelled otherwise, so it needs no
// timer and no goroutine, and a sender reuses its own from batch to batch
// (context.WithDeadline would allocate, and start and stop a timer, per
// batch). Done is nil: a pool wait ends at the pool timeout instead.
// (A sender's pipeline keeps no context between batches: each command
// is given ctx when it is queued.)
type deadlineCtx struct{ deadline time.Time }

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *deadlineCtx) Done() <-chan struct{}       { return nil }
func (c *deadlineCtx) Value(any) any               { return nil }
func (c *deadlineCtx) Err() error {
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}
