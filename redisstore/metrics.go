package redisstore

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// The store's collectors, created once per process and registered in every
// configuration's registry (Caddy makes one per config), as the handler's
// are (see the root package's metrics.go). Labels: store is the store
// module's name ("redis", as in caddy_rate_limit_store_duration_seconds),
// target the server or Cluster seeds (scheme and host, never a
// credential), so two Redis stores in one process stay apart; the
// breaker's have node too (node.go: a Cluster master's address, the
// server's for one server; bounded, nodes are few).
var storeMetrics = struct {
	once         sync.Once
	circuitState *prometheus.GaugeVec
	fastFailures *prometheus.CounterVec
	// circuitOpens and circuitFailures: per node, see node.go.
	circuitOpens    *prometheus.CounterVec
	circuitFailures *prometheus.CounterVec
	denyHits        *prometheus.CounterVec
	// unknownDecisions, notSent and lateReplies: see batch.go (deadlines)
	// and docs/redis.md (late replies).
	unknownDecisions *prometheus.CounterVec
	notSent          *prometheus.CounterVec
	lateReplies      *prometheus.CounterVec
	// refundsLost: see refund.go.
	refundsLost *prometheus.CounterVec
	// leaseFailures: see concurrency.go.
	leaseFailures *prometheus.CounterVec
	// allowanceUnits and allowanceDecisions: see allowance.go.
	allowanceUnits     *prometheus.CounterVec
	allowanceDecisions *prometheus.CounterVec
	// syncs, syncDropped, syncLast and syncDuration: see async.go.
	syncs        *prometheus.CounterVec
	syncDropped  *prometheus.CounterVec
	syncLast     *prometheus.GaugeVec
	syncDuration *prometheus.HistogramVec
	// restarts and evictedKeys: see eviction.go.
	restarts    *prometheus.CounterVec
	evictedKeys *prometheus.CounterVec
}{}

func initStoreMetrics() {
	const ns, sub = "caddy", "rate_limit"
	storeMetrics.once.Do(func() {
		storeMetrics.circuitState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "circuit_state",
			Help: "State of the circuit breaker of each store node (a Cluster master, or the one server): 0 closed, 1 half-open (one probe in flight), 2 open (the node not called).",
		}, []string{"store", "target", "node"})
		storeMetrics.fastFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "circuit_fast_failures_total",
			Help: "Store calls failed at once by a node's open circuit breaker (each zone's fail policy applied, no timeout paid).",
		}, []string{"store", "target", "node"})
		storeMetrics.circuitOpens = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "circuit_opens_total",
			Help: "Outages: times a node's circuit breaker opened after a run of failures.",
		}, []string{"store", "target", "node"})
		storeMetrics.circuitFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "circuit_failures_total",
			Help: "Store calls to a node that failed in a way its circuit breaker counts (timeout, connection, READONLY, NOREPLICAS, OOM, LOADING, CLUSTERDOWN, TRYAGAIN, BUSY …).",
		}, []string{"store", "target", "node"})
		storeMetrics.denyHits = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "deny_cache_hits_total",
			Help: "Requests refused by this instance's deny cache without calling the store (store calls saved).",
		}, []string{"store", "target"})
		storeMetrics.unknownDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_unknown_decisions_total",
			Help: "Decisions sent to the store whose reply did not come within the timeout plus the late-reply grace: Redis may have decided them, and the zones' fail policy applied (under fail open, each is an admission Redis may have refused, so a zone admits at most its limit plus these).",
		}, []string{"store", "target"})
		storeMetrics.notSent = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_unsent_timeouts_total",
			Help: "Decisions whose timeout passed before they were sent to the store (its pipelines busy, or this process short of CPU): nothing was decided or charged, and the zones' fail policy applied.",
		}, []string{"store", "target"})
		storeMetrics.lateReplies = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_late_replies_total",
			Help: "Decisions whose reply came after the timeout, within the late-reply grace, and decided (without the grace each would have been a failure, under fail open an admission).",
		}, []string{"store", "target"})
		storeMetrics.refundsLost = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_refunds_lost_total",
			Help: "Refunds (a count zone's charge given back for a response whose status does not count) that did not reach the store: breaker open, queue full, timeout, error or shutdown; the charge stays until the key refills.",
		}, []string{"store", "target"})
		storeMetrics.leaseFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "lease_failures_total",
			Help: "Concurrency leases whose release (op release) or renewal (op renew) could not reach Redis: a release given up leaves its slot to the lease's expiry; a failed renewal is tried again on the next tick.",
		}, []string{"store", "target", "op"})
		storeMetrics.allowanceUnits = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "local_allowance_units_total",
			Help: "Units of budget in this instance's local allowances (local_allowance), by event: drawn (batches Redis confirmed, beyond the drawing requests' own costs), spent (by requests decided here), returned (unspent, refunded to Redis), lost (held and dropped unspent: Redis lost or restarted, or a refund given up; the key refills them), unconfirmed (batches whose draw got no reply: Redis may have charged them). drawn = spent + returned + lost + what the instance holds (its leases' units and refunds not yet confirmed).",
		}, []string{"store", "target", "event"})
		storeMetrics.allowanceDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "local_allowance_decisions_total",
			Help: "Requests decided from local allowances alone, without calling Redis.",
		}, []string{"store", "target"})
		storeMetrics.syncs = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "sync_runs_total",
			Help: "Syncs of the zones in the asynchronous mode (sync): each sends this instance's charges of the keys requested since the last and reads their counts back, by outcome (ok, failed: the charges are kept and sent again).",
		}, []string{"store", "target", "outcome"})
		storeMetrics.syncDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "sync_dropped_units_total",
			Help: "Units charged in the asynchronous mode and dropped unsent: a key dropped for its zone's max_keys while it held charges (during an outage, keys past the bound).",
		}, []string{"store", "target"})
		storeMetrics.syncLast = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "sync_last_success_timestamp_seconds",
			Help: "When the last successful sync of the asynchronous mode started (Unix seconds): time() minus it is the lag of the counts this instance decides on.",
		}, []string{"store", "target"})
		storeMetrics.syncDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "sync_duration_seconds",
			Help:    "How long each sync of the asynchronous mode that had keys to send took, from its start to its last reply. Syncs longer than the interval mean the counts this instance decides on are older than the interval (a sync follows the last at once then) and a sliding window's previous count is read for longer (4 of the slowest recent syncs into a window, not 4 intervals).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"store", "target"})
		storeMetrics.restarts = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_restarts_total",
			Help: "Restarts (or failovers) of a Redis master the store's watch saw (its run_id changed), by whether its data survived (data kept or lost: lost gives every key a fresh limit).",
		}, []string{"store", "target", "data"})
		storeMetrics.evictedKeys = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_evicted_keys_total",
			Help: "Keys Redis evicted for memory (its evicted_keys, Sluice's and others' in the same server), as the store's watch saw them rise: each evicted Sluice key gives its client up to one full limit again.",
		}, []string{"store", "target"})
	})
}

// registerStoreMetrics registers the store's collectors in a config's
// registry (already registered is fine: the collectors carry across
// reloads).
func registerStoreMetrics(registry *prometheus.Registry) error {
	initStoreMetrics()
	if registry == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{storeMetrics.circuitState, storeMetrics.fastFailures, storeMetrics.circuitOpens, storeMetrics.circuitFailures, storeMetrics.denyHits, storeMetrics.unknownDecisions, storeMetrics.notSent, storeMetrics.lateReplies,
		storeMetrics.refundsLost, storeMetrics.leaseFailures, storeMetrics.allowanceUnits, storeMetrics.allowanceDecisions, storeMetrics.restarts, storeMetrics.evictedKeys,
		storeMetrics.syncs, storeMetrics.syncDropped, storeMetrics.syncLast, storeMetrics.syncDuration} {
		if err := registry.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}
