package redisstore

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// node is one server the store's decisions go to: the server of a
// standalone or Sentinel store, or one master of a Cluster. Each has its
// own circuit breaker and pipeline workers, so a node that fails or stalls
// costs only its own keys: calls for the other nodes neither share its
// batches (a Cluster pipeline waits for its slowest node) nor its breaker.
type node struct {
	addr    string                       // the node label of the metrics and the admin API
	client  atomic.Pointer[redis.Client] // Cluster: go-redis's client of this master
	breaker *breaker                     // nil: disabled
	batch   *batcher

	failures    atomic.Int64 // calls that failed in a way the breaker counts
	failuresCtr prometheus.Counter
}

// reloadEvery is the least time between two reloads of the Cluster's slot
// map asked for by failing nodes (reloadHashSlots).
const reloadEvery = 250 * time.Millisecond

// unmappedNode labels a Cluster store's node of last resort: the calls for
// hash slots whose master is not known (before the hash slot map first loads).
const unmappedNode = "unmapped"

// newNode returns a node with its breaker and pipeline workers, reporting
// under the node label addr.
func (s *Store) newNode(addr string) *node {
	o := s.opts
	n := &node{addr: addr, breaker: newBreaker(o.Failures, o.Cooldown, o.MaxCooldown)}
	n.batch = newBatcher(s.client, s.cluster, &s.scripts, o.Workers, s.timeout, o.Grace)
	lv := []string{"redis", o.Target}
	n.batch.late = storeMetrics.lateReplies.WithLabelValues(lv...)
	lv = append(lv, addr)
	n.failuresCtr = storeMetrics.circuitFailures.WithLabelValues(lv...)
	b := n.breaker
	if b == nil {
		return n
	}
	b.fastCtr = storeMetrics.fastFailures.WithLabelValues(lv...)
	opens := storeMetrics.circuitOpens.WithLabelValues(lv...)
	gauge := storeMetrics.circuitState.WithLabelValues(lv...)
	gauge.Set(float64(circuitClosed))
	logger := o.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	b.onChange = func(from, to int32, cause error, cooldown, outage time.Duration, fast int64) {
		gauge.Set(float64(to))
		switch {
		case to == circuitOpen && from == circuitClosed:
			opens.Inc()
			logger.Error("redis circuit breaker opened: Redis is not called during the cool-down; each zone's fail policy applies at once",
				zap.String("target", o.Target), zap.String("node", addr), zap.Duration("cooldown", cooldown), zap.Error(cause))
		case to == circuitClosed:
			logger.Info("redis circuit breaker closed: decisions by Redis resumed",
				zap.String("target", o.Target), zap.String("node", addr), zap.Duration("outage", outage), zap.Int64("fast_failures_total", fast))
		default: // half-open and reopened: once per cool-down, not an event to page on
			if ce := logger.Check(zap.DebugLevel, "redis circuit breaker "+stateNames[to]); ce != nil {
				fields := []zap.Field{zap.String("target", o.Target), zap.String("node", addr), zap.Duration("cooldown", cooldown)}
				if cause != nil {
					fields = append(fields, zap.Error(cause))
				}
				ce.Write(fields...)
			}
		}
	}
	return n
}

// close stops the node's workers and drops its state's series (its
// counters carry on in a store of the same target made next).
func (n *node) close(target string) {
	n.batch.close()
	storeMetrics.circuitState.DeleteLabelValues("redis", target, n.addr)
}

// dropNodeSeries drops a retired node's series of the breaker's metrics
// (so that the node label keeps to the masters of the day).
func dropNodeSeries(target, addr string) {
	for _, v := range []interface{ DeleteLabelValues(...string) bool }{storeMetrics.circuitState, storeMetrics.fastFailures, storeMetrics.circuitOpens, storeMetrics.circuitFailures} {
		v.DeleteLabelValues("redis", target, addr)
	}
}

// nodeFor returns the node that decides key: the store's only node, or the
// Cluster master go-redis routes key to (the same hash slot map, so the
// breaker and the workers chosen are those of the node the call goes to).
// Before the hash slot map is known, and while the node of last resort's
// breaker is open then, it is that node: asking go-redis for the master
// would load the map within the decision, at every decision of an outage.
func (s *Store) nodeFor(ctx context.Context, key string) *node {
	if s.cc == nil {
		return s.one
	}
	ns := *s.nodes.Load()
	if len(ns) == 0 && s.one.breaker != nil && s.one.breaker.state.Load() != circuitClosed {
		return s.one
	}
	cl, err := s.cc.MasterForKey(ctx, key)
	if err != nil {
		return s.one
	}
	for _, n := range ns {
		if n.client.Load() == cl {
			return n
		}
	}
	return s.addNode(cl)
}

// addNode returns the node of master cl, made on first sight. go-redis may
// replace a node's client (it closes those it has not seen in the hash slot map
// for a while): the node of that address is kept, with its breaker.
func (s *Store) addNode(cl *redis.Client) *node {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	ns := *s.nodes.Load()
	addr := cl.Options().Addr
	for _, n := range ns {
		if n.client.Load() == cl {
			return n
		}
		if n.addr == addr {
			n.client.Store(cl)
			return n
		}
	}
	n := s.newNode(addr)
	n.client.Store(cl)
	ns = append(slices.Clip(ns), n)
	s.nodes.Store(&ns)
	return n
}

// allNodes returns every node the store has: its only one, or the Cluster
// masters seen (and the node of last resort, once it has been used).
func (s *Store) allNodes() []*node {
	if s.cc == nil {
		return []*node{s.one}
	}
	ns := slices.Clone(*s.nodes.Load())
	if s.one.failures.Load() > 0 || s.one.breaker.State() != "closed" && s.one.breaker.State() != "disabled" {
		ns = append(ns, s.one)
	}
	return ns
}

// nodeFailed is told of a call that failed on n (counted by the breaker,
// or failed fast by its open breaker). In a Cluster it reloads the slot
// map (reloadHashSlots), at most once per reloadEvery: a dead master never
// answers MOVED, so without it its slots would stay mapped to it until
// go-redis's periodic reload (a minute), though a replica took them over.
func (s *Store) nodeFailed(n *node) {
	if s.cc == nil {
		return
	}
	now := monoNow()
	last := s.reloadAt.Load()
	if now-last < int64(reloadEvery) || !s.reloadAt.CompareAndSwap(last, now) || !s.reloading.CompareAndSwap(false, true) {
		return
	}
	go s.reloadHashSlots()
}

// reloadTimeout bounds one reload of the hash slot map (go-redis asks the nodes
// in turn until one answers).
const reloadTimeout = 2 * time.Second

// reloadHashSlots reloads go-redis's hash slot map (ForEachMaster reloads it
// before it lists the masters) and retires the nodes that are no longer
// masters: a dead master's breaker, open, would otherwise stay so. When
// the masters changed, the open breakers of the others probe at once.
func (s *Store) reloadHashSlots() {
	defer s.reloading.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), reloadTimeout)
	defer cancel()
	var mu sync.Mutex
	masters := map[string]bool{}
	err := s.cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		masters[c.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	if err != nil {
		return
	}
	s.nodesMu.Lock()
	changed := !maps.Equal(masters, s.masters)
	s.masters = masters
	ns := *s.nodes.Load()
	keep := make([]*node, 0, len(ns))
	var gone []*node
	for _, n := range ns {
		if masters[n.addr] {
			keep = append(keep, n)
		} else {
			gone = append(gone, n)
		}
	}
	if len(gone) > 0 {
		s.nodes.Store(&keep)
	}
	s.nodesMu.Unlock()
	if changed {
		// A new master, or one gone: hash slots may have moved to a node whose
		// breaker is open (or to the node of last resort's); it probes now
		// rather than after its cool-down.
		s.one.breaker.probeNow()
		for _, n := range keep {
			n.breaker.probeNow()
		}
	}
	for _, n := range gone {
		if s.opts.Logger != nil {
			s.opts.Logger.Info("redis cluster node no longer a master: its breaker is retired",
				zap.String("target", s.opts.Target), zap.String("node", n.addr), zap.String("circuit", n.breaker.State()))
		}
		dropNodeSeries(s.opts.Target, n.addr)
		// Calls already handed to its workers are sent still (go-redis
		// routes them by the new map); then they stop.
		time.AfterFunc(s.timeout+s.opts.Grace+time.Second, n.batch.close)
	}
}

// NodeState is one node's circuit breaker as the admin API shows it.
type NodeState struct {
	Node         string `json:"node"`
	Circuit      string `json:"circuit"`
	Outages      int64  `json:"outages"`       // times its breaker opened
	Failures     int64  `json:"failures"`      // calls failed in a way the breaker counts
	FastFailures int64  `json:"fast_failures"` // calls failed at once by its open breaker
}

// Nodes reports each node's breaker (for the admin API and tests).
func (s *Store) Nodes() []NodeState {
	ns := s.allNodes()
	out := make([]NodeState, len(ns))
	for i, n := range ns {
		out[i] = NodeState{Node: n.addr, Circuit: n.breaker.State(), Failures: n.failures.Load()}
		if b := n.breaker; b != nil {
			out[i].Outages, out[i].FastFailures = b.opens.Load(), b.fast.Load()
		}
	}
	return out
}
