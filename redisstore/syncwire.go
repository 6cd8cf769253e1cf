package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// The asynchronous mode's exchange with Redis. A key of a zone in the mode
// keeps one integer per window, at <key>:<window start, Unix ms>
// (countKey): the units the fleet charged in it, living for as long as it
// can decide (fixed_window: its window; sliding_window: two) plus a
// second. A sync adds each key's charges with INCRBY, whose reply is the
// count, and reads what it did not add to with GET: plain commands,
// pipelined (go-redis routes each to its node in a Cluster), no script,
// so that Redis does one command per key and sync in the common case (the
// previous window's count is read until it is final, a count's TTL set
// with its first charge from this instance). Windows are named by this
// instance's clock, which decides the keys anyway.

// syncOp is one command of a sync.
type syncOp struct {
	item  int   // its key's item
	kind  uint8 // opAdd, opExpire, opCur, opPrev
	start int64 // its window's start
	units int64 // opAdd: the units added; opExpire: the TTL (ms)
	end   int   // its key's end in the names buffer (its start: the previous op's end)
}

const (
	opAdd    = iota // INCRBY <count> <units>
	opExpire        // PEXPIRE <count> <ttl>: after the INCRBY that may have made it
	opCur           // GET the current window's count
	opPrev          // GET the previous window's count (sliding_window)
)

// syncWire is the exchange's memory, kept from sync to sync.
type syncWire struct {
	ops   []syncOp
	names []byte
	strs  []string      // the ops' keys (views of names), for the commands' *string arguments
	args  []interface{} // the commands' arguments, three per op
	cmds  []redis.Cmder
}

// exchange sends items' charges and reads their counts (it sets each
// item's reply or error), in pipelines of at most syncChunk items (so its
// buffers stay that size); after a pipeline whose every item failed, the
// rest is not sent. It returns the first error.
func (y *syncs) exchange(items []syncItem, now int64) error {
	return y.exchangeOn(&y.lanes[0].wire, items, now)
}

// exchangeOn is exchange with x's buffers.
func (y *syncs) exchangeOn(x *syncWire, items []syncItem, now int64) error {
	timeout := max(y.s.timeout, minSyncTimeout) + time.Duration(min(len(items), syncChunk))*syncKeyTimeout
	var first, down error
	for from := 0; from < len(items); from += syncChunk {
		chunk := items[from:min(from+syncChunk, len(items))]
		if down != nil {
			for i := range chunk {
				chunk[i].err = down // not sent
			}
			continue
		}
		x.plan(y, chunk, now)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		failed, err := x.run(ctx, y.s.client, chunk)
		cancel()
		clear(x.cmds)
		clear(x.args)
		if first == nil {
			first = err
		}
		if failed == len(chunk) {
			down = err // the rest is not sent: Redis (each node of it) failed them all
		}
	}
	y.expireLost(items, now, timeout)
	return first
}

// expireLost sets the TTL of the counts an INCRBY made where the entry
// believed them made (gone meanwhile: a reset, Redis restarted empty), at
// once: a count without a TTL would outlive its window for good. What
// this fails to set, the next sync of the key sets (syncItem.lost).
func (y *syncs) expireLost(items []syncItem, now int64, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var pipe redis.Pipeliner
	var lost []int
	var cmds []*redis.BoolCmd
	for i := range items {
		if it := &items[i]; it.lost && it.err == nil {
			if pipe == nil {
				pipe = y.s.client.Pipeline()
			}
			lost = append(lost, i)
			cmds = append(cmds, pipe.PExpire(ctx, countKey(y.s.Key((*y.names.Load())[it.k.zone], it.k.key), it.l),
				time.Duration(max(it.l+keepFor(it.limit)-now, 1))*time.Millisecond))
		}
	}
	if pipe == nil {
		return
	}
	_, _ = pipe.Exec(ctx)
	for n, i := range lost {
		if cmds[n].Err() == nil {
			items[i].lost, items[i].created = false, true
		}
	}
}

// keepFor is how long past its window's start a count of l lives: as long
// as it can decide, and a second.
func keepFor(l algorithms.Limit) int64 {
	if l.Algorithm == algorithms.SlidingWindow {
		return 2*l.Window + 1000
	}
	return l.Window + 1000
}

// plan lists the commands of every item in order.
func (x *syncWire) plan(y *syncs, items []syncItem, now int64) {
	zones := *y.names.Load()
	x.names, x.ops = x.names[:0], x.ops[:0]
	var kb [128]byte
	for i := range items {
		it := &items[i]
		it.cur, it.prev = -1, -1
		key := y.s.appendKey(kb[:0], zones[it.k.zone], it.k.key)
		w, l := it.limit.Window, it.l
		sliding := it.limit.Algorithm == algorithms.SlidingWindow
		from := l
		if sliding {
			from = l - w
		}
		keep := keepFor(it.limit)
		var added [2]int64 // the windows charged
		for c, ch := range it.sent {
			// A charge counts in its own window; one that has ended counts
			// nowhere (nor one past the current: a clock gone back).
			if ch.Units <= 0 || ch.Start < from || ch.Start > l || (ch.Start-l)%w != 0 {
				continue
			}
			added[c] = ch.Start
			x.add(i, opAdd, key, ch.Start, ch.Units)
			if ch.Start != l {
				x.add(i, opExpire, key, ch.Start, max(ch.Start+keep-now, 1))
			}
		}
		if added[0] != l && added[1] != l {
			x.add(i, opCur, key, l, 0)
		}
		if !it.made {
			// (A count that does not exist stays so: the instance that
			// makes it sets its TTL.)
			x.add(i, opExpire, key, l, max(l+keep-now, 1))
		}
		if it.bare != 0 && it.bare != l {
			x.add(i, opExpire, key, it.bare, max(it.bare+keep-now, 1))
		}
		if sliding && !it.known && added[0] != l-w && added[1] != l-w {
			x.add(i, opPrev, key, l-w, 0)
		}
	}
}

// add lists a command of item i on key's count in the window at start.
func (x *syncWire) add(i int, kind uint8, key []byte, start, units int64) {
	x.names = appendCountKey(append(x.names, key...), start)
	x.ops = append(x.ops, syncOp{item: i, kind: kind, start: start, units: units, end: len(x.names)})
}

// run sends the planned ops in one pipeline and sets their items' replies,
// or errors: an item fails with any of its commands (in a Cluster, those
// of a failing node), the others stand. It returns how many failed, and
// the first error.
func (x *syncWire) run(ctx context.Context, c redis.UniversalClient, items []syncItem) (int, error) {
	x.strs, x.cmds = x.strs[:0], x.cmds[:0]
	o := 0
	for _, op := range x.ops {
		// (The names buffer is whole: plan is done.)
		x.strs = append(x.strs, unsafe.String(&x.names[o], op.end-o))
		o = op.end
	}
	// The arguments are pointers (a key's *string, the units' *int64),
	// which go-redis reads as their values, in a buffer kept: a command
	// allocates only itself.
	if n := 3 * len(x.ops); cap(x.args) < n {
		x.args = make([]interface{}, n)
	}
	for n := range x.ops {
		op, args := &x.ops[n], x.args[3*n:3*n+3:3*n+3]
		args[1] = &x.strs[n]
		var cmd redis.Cmder
		switch op.kind {
		case opAdd:
			args[0], args[2] = "incrby", &op.units
			cmd = redis.NewIntCmd(ctx, args...)
		case opExpire:
			args[0], args[2] = "pexpire", &op.units
			cmd = redis.NewBoolCmd(ctx, args...)
		default:
			args[0] = "get"
			cmd = redis.NewStringCmd(ctx, args[:2]...)
		}
		x.cmds = append(x.cmds, cmd)
	}
	pipe := c.Pipeline()
	_ = pipe.BatchProcess(ctx, x.cmds...)
	_, _ = pipe.Exec(ctx) // each command's error is its own
	var first error
	failed := 0
	fail := func(it *syncItem, err error) { // an item fails with its first error
		if it.err == nil {
			it.err = err
			failed++
		}
		if first == nil {
			first = err
		}
	}
	for n, op := range x.ops {
		it := &items[op.item]
		if err := x.cmds[n].Err(); err != nil && !errors.Is(err, redis.Nil) {
			fail(it, err)
			continue
		}
		switch cmd := x.cmds[n].(type) {
		case *redis.IntCmd:
			v := cmd.Val()
			if op.start == it.l {
				it.cur = v
				if it.made && v == op.units {
					it.lost = true // made by this INCRBY: no TTL
				}
			} else {
				it.prev = v
			}
		case *redis.BoolCmd:
			if op.start == it.l {
				it.created = true
			}
		case *redis.StringCmd:
			v, err := cmd.Int64()
			if errors.Is(err, redis.Nil) {
				v, err = 0, nil
			}
			if err != nil {
				fail(it, fmt.Errorf("redis: the count %s: %w", x.strs[n], err))
				continue
			}
			if op.kind == opCur {
				it.cur = v
			} else {
				it.prev = v
			}
		}
	}
	return failed, first
}
