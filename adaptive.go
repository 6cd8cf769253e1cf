package sluice

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/caddy-sluice/adaptive"
	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/telemetry"
)

// adaptiveControl: `concurrent adaptive` limits the requests of one key in
// flight at once on this instance to a limit learnt from the upstream's
// latency (package adaptive). It is decided in this process's memory,
// whatever the store, by a layer of the decide stage (adaptiveLayer) around
// the fail policy: the adaptive zones first (a request over the limit may
// wait, with delay, for a place), then the store for the others, and the
// places it got are given back when the store refuses. An admitted request
// is timed from the moment it is passed on (serve) to its response's first
// byte (status), where it gives its place back (at exit if no byte came).
var adaptiveControl = control{
	name:      "adaptive",
	compile:   compileAdaptive,
	provision: provisionAdaptive,
	cleanup:   cleanupAdaptive,
	admin:     adaptiveInfo,
	layer:     adaptiveDecideLayer,
	hooks: hooks{
		verdict: func(a *admission) {
			if len(a.adapt.holds) > 0 {
				a.wantsStatus = true
			}
		},
		serve:  func(a *admission) error { a.adapt.forwarded = time.Now(); return nil },
		status: adaptiveFirstByte,
		exit:   adaptiveExit,
	},
}

// adaptiveZone is an adaptive zone's run time: its settings and its keys'
// limiters, shared through adaptivePool so that a reload that keeps the
// zone's settings keeps what was learnt.
type adaptiveZone struct {
	settings adaptive.Settings
	wait     time.Duration // delay: how long a request may wait for a place
	poolKey  string
	*adaptiveState
	// shown caches what responses show of each limit up to maxAdaptiveShown.
	shown [maxAdaptiveShown + 1]atomic.Pointer[shownLimit]
}

// maxAdaptiveShown bounds the limits whose header values are formatted
// once; past it, each response formats its own.
const maxAdaptiveShown = 4096

// adaptiveState is the part of an adaptive zone a reload keeps: its keys'
// limiters (sharded maps: a lookup allocates nothing) and its gauges.
type adaptiveState struct {
	shards [adaptiveShards]struct {
		mu   sync.RWMutex
		keys map[algorithms.Key]*adaptiveKey
	}
	// gauges are the zone's metrics (nil without metrics): the last closed
	// window's limit, baseline and latency, of whichever key closed it.
	limitGauge, baselineGauge, latencyGauge prometheus.Gauge
	last                                    atomic.Pointer[adaptiveKey]
}

// Destruct implements caddy.Destructor: nothing to free.
func (*adaptiveState) Destruct() error { return nil }

const (
	adaptiveShards = 16
	// adaptiveMaxKeys bounds the keys one zone remembers; past it, idle
	// keys (none in flight) are forgotten as new ones come.
	adaptiveMaxKeys = 100000
)

// adaptivePool keeps adaptive zones' states across reloads, keyed by the
// zone's name and settings.
var adaptivePool = caddy.NewUsagePool()

// adaptiveKey is one key's limiter, and the wake-up of its waiters (delay).
type adaptiveKey struct {
	lim     *adaptive.Limiter
	waiters atomic.Int32
	// pins counts the admissions between finding the key (keyOf) and
	// holding a place or giving up: a pinned key is not forgotten, so two
	// limiters never count one key.
	pins atomic.Int32
	free chan struct{} // one token: a place was given back
}

// adaptiveRequest is adaptive's part of one admission: the adaptive zones'
// holds, and when the request was passed on (serve), 0 before.
type adaptiveRequest struct {
	holds     []adaptiveHold
	forwarded time.Time
}

// recycled returns r emptied for the admission's next use, its holds'
// array kept (the admission is pooled).
func (r *adaptiveRequest) recycled() adaptiveRequest {
	clear(r.holds)
	return adaptiveRequest{holds: r.holds[:0]}
}

// adaptiveHold is an adaptive zone's part of one admission: its request,
// decision and the place it holds, kept apart from the store's zones
// during the decide stage (adaptiveLayer).
type adaptiveHold struct {
	zone  *zone
	req   algorithms.Request
	dec   algorithms.Decision
	shown *shownLimit
	key   *adaptiveKey
	// inFlight: the requests in flight when it was admitted; held: it
	// holds a place; sampled: its latency was measured.
	inFlight      int64
	held, sampled bool
}

// epoch is the instant the limiters' clock counts from.
var epoch = time.Now()

var errAdaptiveAbandoned = errors.New("the client went away while its request waited for a place under the adaptive limit")

// compileAdaptive sets an adaptive zone's run time up (its state comes at
// Provision).
func compileAdaptive(z *zone, cfg *Zone) error {
	if cfg.Adaptive == nil {
		return nil
	}
	s, err := cfg.Adaptive.Settings() // checked by the zone model
	if err != nil {
		return err
	}
	z.adapt = &adaptiveZone{settings: s, wait: time.Duration(cfg.Delay), poolKey: z.name + "\x00" + z.dynSpec}
	z.giver = z.adapt
	return nil
}

// give keeps an adaptive zone's charge (reservation.go): its place is this
// process's, given back by the control (adaptiveFirstByte, adaptiveExit),
// and the store holds nothing of it.
func (*adaptiveZone) give(*charge, giving, int, *algorithms.Refund) gift { return keep }

// provisionAdaptive loads each adaptive zone's state (kept from the last
// configuration when its settings are the same) and its gauges.
func provisionAdaptive(h *Handler) (stages, error) {
	used := false
	for _, z := range h.zones {
		if z.adapt == nil {
			continue
		}
		used = true
		st, _, err := adaptivePool.LoadOrNew(z.adapt.poolKey, func() (caddy.Destructor, error) {
			return new(adaptiveState), nil
		})
		if err != nil {
			return 0, zoneErr(z.name, err)
		}
		z.adapt.adaptiveState = st.(*adaptiveState)
		if z.metrics != nil {
			s := z.adapt.adaptiveState
			s.limitGauge = telemetry.Metrics.AdaptiveLimit.WithLabelValues(z.name)
			s.baselineGauge = telemetry.Metrics.AdaptiveBaseline.WithLabelValues(z.name)
			s.latencyGauge = telemetry.Metrics.AdaptiveLatency.WithLabelValues(z.name)
			telemetry.Metrics.AdaptiveMinimum.WithLabelValues(z.name).Set(float64(z.adapt.settings.Minimum))
			telemetry.Metrics.AdaptiveMaximum.WithLabelValues(z.name).Set(float64(z.adapt.settings.Maximum))
		}
	}
	if !used {
		return 0, nil
	}
	return joins(atVerdict, atServe, atStatus, atExit), nil
}

// cleanupAdaptive lets go of the zones' states (the pool frees a state no
// configuration uses).
func cleanupAdaptive(h *Handler) {
	for _, z := range h.zones {
		if z.adapt != nil && z.adapt.adaptiveState != nil {
			_, _ = adaptivePool.Delete(z.adapt.poolKey)
		}
	}
}

// keyOf returns key k's limiter, made at the zone's initial limit if new,
// pinned (the caller unpins it once it holds a place or gave up).
func (az *adaptiveZone) keyOf(k algorithms.Key) *adaptiveKey {
	sh := &az.shards[int(k[len(k)-1])%adaptiveShards]
	sh.mu.RLock()
	ak := sh.keys[k]
	if ak != nil {
		ak.pins.Add(1)
	}
	sh.mu.RUnlock()
	if ak != nil {
		return ak
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ak = sh.keys[k]; ak != nil {
		ak.pins.Add(1)
		return ak
	}
	if sh.keys == nil {
		sh.keys = make(map[algorithms.Key]*adaptiveKey)
	}
	if len(sh.keys) >= adaptiveMaxKeys/adaptiveShards {
		for old, ok := range sh.keys {
			if ok.lim.InFlight() == 0 && ok.waiters.Load() == 0 && ok.pins.Load() == 0 {
				delete(sh.keys, old)
			}
		}
	}
	ak = &adaptiveKey{lim: adaptive.NewLimiter(az.settings), free: make(chan struct{}, 1)}
	ak.pins.Store(1)
	sh.keys[k] = ak
	return ak
}

// each calls f on every key's limiter.
func (az *adaptiveZone) each(f func(*adaptiveKey)) {
	for i := range az.shards {
		sh := &az.shards[i]
		sh.mu.RLock()
		for _, ak := range sh.keys {
			f(ak)
		}
		sh.mu.RUnlock()
	}
}

// adaptiveShown returns what responses show of an adaptive zone's limit n.
func (z *zone) adaptiveShown(n int64) *shownLimit {
	az := z.adapt
	if n < 0 || n > maxAdaptiveShown {
		s := z.showLimit(algorithms.Limit{Algorithm: algorithms.Concurrency, Events: n, Window: z.limit.Window})
		return &s
	}
	if s := az.shown[n].Load(); s != nil {
		return s
	}
	s := z.showLimit(algorithms.Limit{Algorithm: algorithms.Concurrency, Events: n, Window: z.limit.Window})
	az.shown[n].Store(&s)
	return &s
}

// release gives a place back and wakes a waiter.
func (ak *adaptiveKey) release() {
	ak.lim.Release()
	if ak.waiters.Load() > 0 {
		select {
		case ak.free <- struct{}{}:
		default:
		}
	}
}

// adaptiveDecideLayer puts adaptiveLayer around the decide stage of a
// directive with adaptive zones.
func adaptiveDecideLayer(h *Handler, next decider) decider {
	for _, z := range h.zones {
		if z.adapt != nil {
			return adaptiveLayer{next}
		}
	}
	return next
}

// adaptiveLayer is the decide stage's outer layer in a directive with
// adaptive zones: it decides them here, then asks next (the fail policy
// over the store) for the other zones, all-or-nothing across both.
type adaptiveLayer struct{ next decider }

func (l adaptiveLayer) decide(a *admission) error {
	// The adaptive zones leave the planned lists for a.adapt.holds.
	n := 0
	for i := range a.reqs {
		if z := a.zones[i]; z.adapt != nil {
			a.adapt.holds = append(a.adapt.holds, adaptiveHold{zone: z, req: a.reqs[i]})
			continue
		}
		a.reqs[n], a.zones[n], a.shown[n] = a.reqs[i], a.zones[i], a.shown[i]
		n++
	}
	if len(a.adapt.holds) == 0 {
		return l.next.decide(a)
	}
	a.reqs, a.zones, a.shown, a.decs = a.reqs[:n], a.zones[:n], a.shown[:n], a.decs[:n]
	refused, err := acquireAdaptive(a)
	switch {
	case err != nil:
		releaseAdaptive(a)
		return err
	case refused:
		// Refused here: the store is not asked, and the request shows the
		// adaptive zones alone.
		releaseAdaptive(a)
		a.reqs, a.zones, a.shown, a.decs = a.reqs[:0], a.zones[:0], a.shown[:0], a.decs[:0]
		a.out, a.store = decided, a.h.store
		rejoinAdaptive(a)
		return nil
	case n == 0:
		a.out, a.store = decided, a.h.store
		rejoinAdaptive(a)
		return nil
	}
	if err := l.next.decide(a); err != nil {
		releaseAdaptive(a)
		return err
	}
	switch a.out {
	case failClosed:
		releaseAdaptive(a)
		return nil
	case unmetered: // no store zone decided: the adaptive ones stand
		a.reqs, a.zones, a.shown, a.decs = a.reqs[:0], a.zones[:0], a.shown[:0], a.decs[:0]
		a.out, a.store = decided, a.h.store
	default:
		for i := range a.decs {
			if !a.decs[i].Allowed && !a.reqs[i].ReportOnly {
				releaseAdaptive(a) // the store refuses: all-or-nothing
				break
			}
		}
	}
	rejoinAdaptive(a)
	return nil
}

// rejoinAdaptive appends the adaptive zones back to the decided lists.
func rejoinAdaptive(a *admission) {
	for i := range a.adapt.holds {
		ah := &a.adapt.holds[i]
		a.reqs = append(a.reqs, ah.req)
		a.decs = append(a.decs, ah.dec)
		a.zones = append(a.zones, ah.zone)
		a.shown = append(a.shown, ah.shown)
	}
}

// acquireAdaptive gets a place under each adaptive zone's limit (a
// report-only zone gets one whatever the limit), waiting up to the
// zone's delay for one; it reports whether an enforcing zone refuses. An
// error is a client gone while waiting (499).
func acquireAdaptive(a *admission) (refused bool, err error) {
	for i := range a.adapt.holds {
		ah := &a.adapt.holds[i]
		z := ah.zone
		ah.key = z.adapt.keyOf(ah.req.Key)
		lim := ah.key.lim
		if ah.req.ReportOnly {
			ah.inFlight, ah.held = lim.Force(), true
		} else if ah.inFlight = lim.Acquire(); ah.inFlight > 0 {
			ah.held = true
		} else if z.adapt.wait > 0 {
			ah.inFlight, err = waitForPlace(a, ah)
			ah.held = err == nil && ah.inFlight > 0
		}
		ah.key.pins.Add(-1) // held, or not: forgettable when idle
		if err != nil {
			return false, err
		}
		limit := lim.Limit()
		ah.req.Limit.Events = limit
		ah.shown = z.adaptiveShown(limit)
		d := algorithms.Decision{Allowed: ah.held && ah.inFlight <= limit, Limit: limit, Remaining: max(limit-max(ah.inFlight, lim.InFlight()), 0)}
		if !d.Allowed {
			d.RetryAfter = adaptiveRetryHint(lim)
			d.ResetAfter = d.RetryAfter
			refused = refused || !ah.req.ReportOnly
		}
		ah.dec = d
	}
	return refused, nil
}

// adaptiveRetryHint is an adaptive refusal's Retry-After: the latency this
// instance measured of the key's admitted requests (a place frees within
// about that long), at least a second, at most maxConcurrencyRetry.
func adaptiveRetryHint(lim *adaptive.Limiter) time.Duration {
	return min(max(lim.Latency(), time.Second), maxConcurrencyRetry)
}

// waitForPlace waits up to the zone's delay for a place under ah's limit,
// in a seat of the waiting room (full: refused at once), woken when
// a place is given back. It returns the requests in flight with this one,
// 0 if none freed in time, or a 499 error if the client left.
func waitForPlace(a *admission, ah *adaptiveHold) (int64, error) {
	if !a.enterRoom() {
		return 0, nil
	}
	ak := ah.key
	ak.waiters.Add(1)
	defer ak.waiters.Add(-1)
	t := timerPool.Get().(*time.Timer)
	t.Reset(ah.zone.adapt.wait)
	defer func() {
		t.Stop()
		timerPool.Put(t)
	}()
	c := watchClient(a.r)
	defer c.stop()
	for {
		if n := ak.lim.Acquire(); n > 0 {
			if ak.lim.InFlight() < ak.lim.Limit() && ak.waiters.Load() > 1 {
				select { // room for the next waiter too
				case ak.free <- struct{}{}:
				default:
				}
			}
			return n, nil
		}
		select {
		case <-ak.free:
		case <-t.C:
			return 0, nil
		case <-c.done():
			return 0, caddyhttp.Error(statusClientClosed, errAdaptiveAbandoned)
		}
	}
}

// releaseAdaptive gives back every place the admission holds.
func releaseAdaptive(a *admission) {
	for i := range a.adapt.holds {
		if ah := &a.adapt.holds[i]; ah.held {
			ah.held = false
			ah.key.release()
		}
	}
}

// adaptiveFirstByte records each admitted adaptive zone's latency sample at
// the response's first byte (its status known), and gives its place back
// then: whatever the response's shape (a short answer, an event stream,
// NDJSON, a download, a gRPC stream, a 101), the limit counts the requests
// waiting for their first byte and the sample is that wait, one thing
// (docs/adaptive.md, "Long responses").
func adaptiveFirstByte(a *admission, status int) {
	if len(a.adapt.holds) == 0 || a.adapt.forwarded.IsZero() {
		return
	}
	now := time.Now()
	for i := range a.adapt.holds {
		ah := &a.adapt.holds[i]
		if !ah.held || ah.sampled {
			continue
		}
		ah.sampled, ah.held = true, false
		ah.key.release()
		if status == statusUnknown || status == statusRefusal {
			continue // the client left first, or a later handler refused
		}
		if ah.key.lim.Observe(now.Sub(epoch), now.Sub(a.adapt.forwarded), ah.inFlight) {
			ah.zone.adapt.observed(ah.key)
		}
	}
}

// observed updates the zone's gauges from key ak, whose window closed.
func (az *adaptiveZone) observed(ak *adaptiveKey) {
	az.last.Store(ak)
	if az.limitGauge != nil {
		az.limitGauge.Set(float64(ak.lim.Limit()))
		az.baselineGauge.Set(ak.lim.Baseline().Seconds())
		az.latencyGauge.Set(ak.lim.Latency().Seconds())
	}
}

// adaptiveExit gives back the places an admitted request still holds.
func adaptiveExit(a *admission) {
	releaseAdaptive(a)
}

// adaptiveInfo fills in an adaptive zone's fields of the admin listing.
func adaptiveInfo(z *zone, i *adminZoneInfo) {
	az := z.adapt
	if az == nil {
		return
	}
	s := az.settings
	info := &adminAdaptive{Controller: s.Controller, Minimum: s.Minimum, Maximum: s.Maximum, Initial: s.Initial,
		Tolerance: s.Tolerance, Window: s.Window.String(), Limit: s.Initial}
	if az.wait > 0 {
		info.Delay = az.wait.String()
	}
	if az.adaptiveState != nil {
		az.each(func(ak *adaptiveKey) {
			info.InFlight += ak.lim.InFlight()
			info.Keys++
		})
		last := az.last.Load()
		if last == nil && info.Keys == 1 {
			az.each(func(ak *adaptiveKey) { last = ak })
		}
		if last != nil {
			info.Limit = last.lim.Limit()
			info.BaselineMs = float64(last.lim.Baseline()) / float64(time.Millisecond)
			info.LatencyMs = float64(last.lim.Latency()) / float64(time.Millisecond)
		}
	}
	i.Algorithm, i.Adaptive = "adaptive", info
	i.Concurrent, i.Lease, i.LeaseMs = info.Limit, "", 0
	i.Events, i.Window, i.WindowMs, i.Burst, i.Capacity = 0, "", 0, 0, info.Limit
}
