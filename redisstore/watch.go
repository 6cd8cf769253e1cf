package redisstore

import (
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/denycache"
)

// The watch: a goroutine per store (started with it, stopped by Destruct)
// polls, every watchInterval, on every master, the reset counter
// (<prefix>ctl:{sluice}:resets), a canary (<prefix>ctl:{<tag>}:epoch), the
// master's run_id and evicted_keys, and its clock. A changed view or a
// failed poll clears the deny cache (a changed view also makes the local
// allowance forget its grants); a clock that stepped forward clears it too.
// The cache stores nothing before the first successful poll (Arm). Skipped
// while the breaker is open. What each fact catches, and the ACL cases:
// docs/redis.md, "The watch".

// watchInterval is the time between two polls.
const watchInterval = 250 * time.Millisecond

// ctlTag is the hash tag of the store's control keys.
const ctlTag = "sluice"

// ctlKey is the name of a control key: <prefix>ctl:{<tag>}:<name>. No key
// of a zone has this form: theirs end with the '}' of their tag.
func (s *Store) ctlKey(tag, name string) string {
	return s.prefix + "ctl:{" + tag + "}:" + name
}

// resetsKey is the counter of admin resets.
func (s *Store) resetsKey() string { return s.ctlKey(ctlTag, "resets") }

type watcher struct {
	s      *Store
	logger *zap.Logger
	stop   chan struct{}
	done   chan struct{}

	mu         sync.Mutex // serializes polls (the loop's, and tests')
	last       string     // the previous successful poll's view
	seen       bool       // last is set
	failing    bool
	noInfo     bool // INFO refused (NOPERM): not asked any more
	permWarned bool // a NOPERM on the control keys was logged
	// armed is set by the first successful poll: from then on a restart
	// or a flush is seen (compared with last). The local allowance draws
	// no batch before it (allowance.go).
	armed    atomic.Bool
	slotsSig string            // Cluster: the slot map tags was computed for
	tags     map[string]string // Cluster: each master's canary tag
	// Each server's clock as the previous successful poll read it, and as
	// the poll in progress reads it, by canary tag and run_id.
	clocks, next map[string]clockMark
	// Each master's facts (by canary tag) as the previous successful poll
	// read them, and as the poll in progress reads them: restarts and
	// evictions are told from their changes (eviction.go).
	facts, nextFacts map[string]nodeFacts
	evict            evictWatch
}

// nodeFacts is what a poll read of one master: its canary, run_id and
// evicted_keys ("" when INFO is refused).
type nodeFacts struct{ epoch, runID, evicted string }

// clockMark is a reading of a server's clock: TIME in microseconds, and
// the local instants (denycache.Now) the poll that read it was sent and
// answered.
type clockMark struct{ us, sent, recv int64 }

// stepped reports whether a server's clock advanced from reading p to
// reading m by more than the local time between them accounts for, with
// 0.1% (clock rates) and 1ms to spare.
func stepped(p, m clockMark) bool {
	local := m.recv - p.sent // ns: the longest real time between the two readings
	return (m.us-p.us)*1000 > local+local/1000+int64(time.Millisecond)
}

// startWatch starts s's watcher; s has a deny cache.
func startWatch(s *Store) *watcher {
	w := &watcher{s: s, logger: s.opts.Logger, stop: make(chan struct{}), done: make(chan struct{})}
	if w.logger == nil {
		w.logger = zap.NewNop()
	}
	go w.run()
	return w
}

// close stops the watcher and waits for its poll in flight (bounded by the
// store's timeout).
func (w *watcher) close() {
	close(w.stop)
	<-w.done
}

func (w *watcher) run() {
	defer close(w.done)
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	for {
		w.once()
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
	}
}

// once polls Redis and acts on what it saw.
func (w *watcher) once() {
	if b := w.s.breaker; b != nil && b.state.Load() == circuitOpen {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), w.s.timeout)
	w.next, w.nextFacts = map[string]clockMark{}, map[string]nodeFacts{}
	view, err := w.view(ctx)
	if err == nil {
		w.evict.poll(ctx, w)
	}
	cancel()
	deny := w.s.deny
	if err != nil {
		deny.Clear()
		if isNoPerm(err) && !w.permWarned {
			// Not a passing failure: a configuration to fix.
			w.permWarned = true
			w.logger.Warn("deny cache: Redis refuses this user the store's control keys ("+w.s.ctlKey(ctlTag, "*")+"): refusals are not cached",
				zap.String("target", w.s.opts.Target), zap.Error(err))
		}
		if !w.failing {
			w.failing = true
			w.logger.Debug("deny cache: Redis cannot be polled; refusals are not cached until it can",
				zap.String("target", w.s.opts.Target), zap.Error(err))
		}
		return
	}
	if w.failing {
		w.failing = false
		w.logger.Debug("deny cache: Redis polled again", zap.String("target", w.s.opts.Target))
	}
	jumped := false
	for id, m := range w.next {
		if p, ok := w.clocks[id]; ok && stepped(p, m) {
			jumped = true
		}
	}
	if w.seen && view != w.last || jumped {
		deny.Clear()
		if w.seen && view != w.last {
			// Restarted, flushed, failed over: the leases' charge may be
			// gone (allowance.go).
			w.s.allowForget()
		}
	}
	w.noteChanges()
	w.last, w.seen, w.clocks, w.facts = view, true, w.next, w.nextFacts
	w.armed.Store(true)
	deny.Arm()
}

// view reads what the watch compares from poll to poll, as one string.
func (w *watcher) view(ctx context.Context) (string, error) {
	if cc, ok := w.s.client.(*redis.ClusterClient); ok {
		return w.clusterView(ctx, cc)
	}
	return w.nodeView(ctx, w.s.client, ctlTag)
}

// clusterView is view on a Cluster: every master's, in address order.
func (w *watcher) clusterView(ctx context.Context, cc *redis.ClusterClient) (string, error) {
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return "", err
	}
	ranges := map[string][][2]int{}
	for _, sl := range slots {
		if len(sl.Nodes) > 0 {
			addr := sl.Nodes[0].Addr
			ranges[addr] = append(ranges[addr], [2]int{sl.Start, sl.End})
		}
	}
	addrs := make([]string, 0, len(ranges))
	for a := range ranges {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	var sig strings.Builder
	for _, a := range addrs {
		slices.SortFunc(ranges[a], func(x, y [2]int) int { return x[0] - y[0] })
		sig.WriteString(a)
		for _, r := range ranges[a] {
			sig.WriteString(" " + strconv.Itoa(r[0]) + "-" + strconv.Itoa(r[1]))
		}
		sig.WriteByte(';')
	}
	if sig.String() != w.slotsSig {
		w.slotsSig, w.tags = sig.String(), map[string]string{}
		for _, a := range addrs {
			w.tags[a] = canaryTag(ranges[a])
		}
	}
	var b strings.Builder
	for _, a := range addrs {
		tag := w.tags[a]
		if tag == "" {
			continue
		}
		node, err := cc.MasterForKey(ctx, w.s.ctlKey(tag, "epoch"))
		if err != nil {
			return "", err
		}
		v, err := w.nodeView(ctx, node, tag)
		if err != nil {
			return "", err
		}
		b.WriteString(a + " (" + node.Options().Addr + "): " + v + "\n")
	}
	return b.String(), nil
}

// canaryTag returns the first of "sluice", "sluice-1", "sluice-2" … whose
// hash slot is in ranges (a master's), or "" if none is found.
func canaryTag(ranges [][2]int) string {
	for i := range 1 << 20 {
		tag := ctlTag
		if i > 0 {
			tag += "-" + strconv.Itoa(i)
		}
		sl := int(hashSlot([]byte(tag)))
		for _, r := range ranges {
			if r[0] <= sl && sl <= r[1] {
				return tag
			}
		}
	}
	return ""
}

// nodeView reads, on one server (the master: a standalone client, the
// Sentinel failover client, or a Cluster master's), its canary of tag,
// the resets counter when it lives there (tag ctlTag), its run_id and its
// evicted_keys, in one pipeline; a missing canary is created (SET NX with a
// random value, then read back: another instance may have won).
func (w *watcher) nodeView(ctx context.Context, c redis.Cmdable, tag string) (string, error) {
	canary := w.s.ctlKey(tag, "epoch")
	keys := []string{canary}
	if tag == ctlTag {
		keys = append(keys, w.s.resetsKey())
	}
	pipe := c.Pipeline()
	vals := pipe.MGet(ctx, keys...)
	clock := pipe.Time(ctx)
	var server, stats *redis.StringCmd
	if !w.noInfo {
		server, stats = pipe.Info(ctx, "server"), pipe.Info(ctx, "stats")
	}
	sent := denycache.Now()
	_, execErr := pipe.Exec(ctx) // each command's error is its own
	recv := denycache.Now()
	v, err := vals.Result()
	if err == nil && len(v) != len(keys) {
		err = errors.Join(errors.New("redis: MGET answered "+strconv.Itoa(len(v))+" values"), execErr)
	}
	if err != nil {
		return "", err
	}
	epoch, _ := v[0].(string)
	if epoch == "" {
		if err := c.SetNX(ctx, canary, rand.Text(), 0).Err(); err != nil {
			return "", err
		}
		if epoch, err = c.Get(ctx, canary).Result(); err != nil {
			return "", err
		}
	}
	now, err := clock.Result()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("epoch " + epoch)
	if len(v) > 1 {
		resets, _ := v[1].(string)
		b.WriteString(" resets " + resets)
	}
	id := "" // the run_id, when INFO tells
	if server != nil {
		si, err1 := server.Result()
		st, err2 := stats.Result()
		switch err := errors.Join(err1, err2); {
		case isNoPerm(err1) || isNoPerm(err2):
			w.noInfo = true
			w.logger.Warn("deny cache: Redis refuses INFO to this user: a restart that reloads a snapshot, a failover and evictions are not detected; "+
				"cached refusals made stale by them last at most their Retry-After (grant the user +info)",
				zap.String("target", w.s.opts.Target), zap.Error(err))
		case err != nil:
			return "", err
		default:
			id = infoField(si, "run_id")
			b.WriteString(" run_id " + id + " evicted_keys " + infoField(st, "evicted_keys"))
		}
	}
	if w.next != nil {
		w.next[tag+" "+id] = clockMark{us: now.UnixMicro(), sent: sent, recv: recv}
	}
	if w.nextFacts != nil {
		f := nodeFacts{epoch: epoch, runID: id}
		if id != "" {
			f.evicted = infoField(stats.Val(), "evicted_keys")
		}
		w.nextFacts[tag] = f
	}
	return b.String(), nil
}

// infoField returns the value of field in an INFO reply ("" if absent).
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func isNoPerm(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOPERM")
}
