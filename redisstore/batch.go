package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pipelining: concurrent decisions share round trips.
//
// One script call per request and one round trip per call made the Redis
// path cost Caddy about 60 µs of CPU per request (a write and a read
// syscall, a pooled connection's bookkeeping, two goroutine wake-ups) and
// Redis about 31 µs per call, where a pipelined call costs Redis under
// 12 µs. So the store hands each script call to a small set of pipeline
// workers: a worker takes the first waiting call and every call queued
// behind it (up to maxBatch), sends them as one pipeline (one write, one
// read) and wakes each caller with its own reply. Nothing waits to fill a
// batch: an idle worker sends a lone call at once, so a quiet server pays
// no latency, and batches grow by themselves exactly when calls arrive
// faster than round trips complete.
//
// Each call is still one script evaluation, atomic in Redis, with its own
// reply: batching changes how calls travel, not what they decide, and a
// failed command (NOSCRIPT, WRONGTYPE …) fails only its own call. A
// request's deadline bounds its whole wait: its caller stops waiting when
// its context ends (the fail policy decides), a worker skips calls whose
// context ended while queued, and a batch's round trip is bounded by the
// latest deadline among its calls (every call has the same timeout, so no
// call's wait is stretched beyond its own).
//
// Cross-slot Cluster requests (a script per slot, then refunds) also go
// through the workers, one call at a time.

const (
	// maxBatch bounds one pipeline (the write buffer and Redis's reply
	// buffer grow with it; beyond a few dozen calls the round trip is no
	// longer the cost).
	maxBatch = 64
	// defaultWorkers is the number of pipelines in flight per store (the
	// store option pipelines). Measured (BenchmarkTakeModes, go test -bench
	// TakeModes ./redisstore/, and make bench): see the README's
	// Performance section.
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
	deadline time.Time       // the decision's: the wait and the round trip end by it
	timer    *time.Timer     // fires at deadline; kept with the call, no allocation per wait
	keys     []string
	args     []any
	cmd      *redis.Cmd    // the reply, set by the worker before done
	done     chan struct{} // capacity 1: a worker never blocks on it
}

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{done: make(chan struct{}, 1), timer: t}
}}

// getCall returns an empty call from the pool for a decision ending at
// deadline.
func getCall(ctx context.Context, deadline time.Time) *call {
	c := callPool.Get().(*call)
	c.ctx, c.deadline = ctx, deadline
	return c
}

// putCall returns a call whose worker is done with it (its done was
// received, or it was never queued) to the pool. A call whose caller
// stopped waiting is never put back: its worker may still use it.
func putCall(c *call) {
	clear(c.keys)
	clear(c.args)
	c.keys, c.args = c.keys[:0], c.args[:0]
	c.ctx, c.cmd = nil, nil
	callPool.Put(c)
}

// batcher runs script calls through pipeline workers.
type batcher struct {
	client  redis.UniversalClient
	scripts *scripts
	queue   chan *call
	stop    chan struct{}
	wg      sync.WaitGroup
}

func newBatcher(client redis.UniversalClient, sc *scripts, workers int) *batcher {
	if workers <= 0 {
		workers = defaultWorkers
	}
	b := &batcher{client: client, scripts: sc, queue: make(chan *call, queueSize), stop: make(chan struct{})}
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
// context. On a nil error the reply is c.cmd and c is the caller's again.
// owned reports whether the caller may reuse c: false when it stopped
// waiting while a worker may still hold c. The wait uses the call's own
// timer, not a context per decision (which would also register with the
// request's context: a lock and a map entry each time).
func (b *batcher) do(c *call) (owned bool, err error) {
	c.timer.Reset(time.Until(c.deadline))
	select {
	case b.queue <- c:
	case <-c.timer.C:
		return true, context.DeadlineExceeded
	case <-c.ctx.Done():
		c.timer.Stop()
		return true, c.ctx.Err()
	}
	select {
	case <-c.done:
		c.timer.Stop()
		return true, nil
	case <-c.timer.C:
		return false, context.DeadlineExceeded
	case <-c.ctx.Done():
		c.timer.Stop()
		return false, c.ctx.Err()
	}
}

func (b *batcher) work() {
	defer b.wg.Done()
	batch := make([]*call, 0, maxBatch)
	for {
		select {
		case <-b.stop:
			return
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		b.exec(batch)
		clear(batch)
	}
}

// exec sends one batch as a pipeline and wakes every caller. Calls whose
// context ended while queued are left alone: their callers have gone.
func (b *batcher) exec(batch []*call) {
	var deadline time.Time
	now := time.Now()
	live := batch[:0]
	for _, c := range batch {
		if c.ctx.Err() != nil || !now.Before(c.deadline) {
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
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	pipe := b.client.Pipeline()
	for _, c := range live {
		c.cmd = b.scripts.queue(ctx, pipe, c.keys, c.args)
	}
	_, _ = pipe.Exec(ctx) // each call's error is on its own command
	// A Redis that lost the code (restart, FUNCTION or SCRIPT FLUSH,
	// failover to a node without it) answers so: load it, send those
	// calls again.
	var again redis.Pipeliner
	var load libLoad
	for _, c := range live {
		if c.cmd.Err() == nil {
			continue
		}
		if again == nil {
			again = b.client.Pipeline()
		}
		b.scripts.retry(ctx, again, c, &load)
	}
	if again != nil && again.Len() > 0 {
		_, _ = again.Exec(ctx)
	}
	for _, c := range live {
		c.done <- struct{}{}
	}
}
