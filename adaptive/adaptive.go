// Package adaptive learns a concurrency limit from the latency of the
// requests it admits: pure controllers (aimd, gradient2, vegas) that turn
// windows of latency samples into a limit, and Limiter, one key's state:
// its limit, its requests in flight, the window being filled, and the
// rules that hold for every controller (Observe). It imports
// nothing of ours and reads no clock: the caller passes the time, so the
// testbed (testbed_test.go) runs it on a virtual clock. docs/adaptive.md
// says how each controller learns and how they compare.
package adaptive

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The controllers.
const (
	Gradient2 = "gradient2"
	Vegas     = "vegas"
	AIMD      = "aimd"
)

// Controllers lists the controllers, the default first.
var Controllers = []string{AIMD, Gradient2, Vegas}

// Defaults, chosen on the testbed (docs/adaptive.md).
const (
	DefaultController = AIMD
	DefaultMinimum    = 2
	DefaultMaximum    = 1000
	DefaultInitial    = 20
	// DefaultTolerance: aimd backs off when a window's latency is past this
	// multiple of its baseline; gradient2's default is
	// DefaultGradient2Tolerance (the gradient's numerator).
	DefaultTolerance          = 1.1
	DefaultGradient2Tolerance = 1.5
	// DefaultSmoothing weighs a new limit against the old (gradient2).
	DefaultSmoothing = 0.2
	// DefaultWindow is the least time a window of samples spans.
	DefaultWindow = 100 * time.Millisecond
	// MaxLimit bounds maximum.
	MaxLimit = 1000000
)

// windowSamples bounds the samples one window holds; a full window is
// closed whatever its age.
const windowSamples = 64

// minWindowSamples is how many samples a window needs before it is closed.
const minWindowSamples = 10

// freshShare: a window of which fewer than 1/freshShare of the samples are
// of requests admitted since the limit last fell cannot lower it again.
const freshShare = 4

// Settings are a zone's controller settings; zero fields take the
// defaults (Resolve).
type Settings struct {
	Controller string
	Minimum    int64
	Maximum    int64
	Initial    int64
	Tolerance  float64
	Smoothing  float64
	Window     time.Duration
}

// Resolve returns s with the defaults filled in, checked; the errors name
// the field.
func (s Settings) Resolve() (Settings, error) {
	if s.Controller == "" {
		s.Controller = DefaultController
	}
	if !slices.Contains(Controllers, s.Controller) {
		return s, fmt.Errorf("controller: unknown %q (known: %s, %s, %s)", s.Controller, AIMD, Gradient2, Vegas)
	}
	if s.Minimum == 0 {
		s.Minimum = DefaultMinimum
	}
	if s.Maximum == 0 {
		s.Maximum = max(DefaultMaximum, s.Minimum)
	}
	if s.Initial == 0 {
		s.Initial = min(max(DefaultInitial, s.Minimum), s.Maximum)
	}
	if s.Tolerance == 0 {
		s.Tolerance = DefaultTolerance
		if s.Controller == Gradient2 {
			s.Tolerance = DefaultGradient2Tolerance
		}
	}
	if s.Smoothing == 0 {
		s.Smoothing = DefaultSmoothing
	}
	if s.Window == 0 {
		s.Window = DefaultWindow
	}
	switch {
	case s.Minimum < 1 || s.Minimum > MaxLimit:
		return s, fmt.Errorf("minimum must be between 1 and %d, got %d", MaxLimit, s.Minimum)
	case s.Maximum < s.Minimum || s.Maximum > MaxLimit:
		return s, fmt.Errorf("maximum must be between minimum (%d) and %d, got %d", s.Minimum, MaxLimit, s.Maximum)
	case s.Initial < s.Minimum || s.Initial > s.Maximum:
		return s, fmt.Errorf("initial must be between minimum (%d) and maximum (%d), got %d", s.Minimum, s.Maximum, s.Initial)
	case s.Tolerance < 1 || s.Tolerance > 10 || math.IsNaN(s.Tolerance):
		return s, fmt.Errorf("tolerance must be between 1 and 10, got %g", s.Tolerance)
	case s.Smoothing <= 0 || s.Smoothing > 1 || math.IsNaN(s.Smoothing):
		return s, fmt.Errorf("smoothing must be above 0 and at most 1, got %g", s.Smoothing)
	case s.Window < time.Millisecond || s.Window > time.Minute:
		return s, fmt.Errorf("window must be between 1ms and 1m, got %s", s.Window)
	}
	return s, nil
}

// Fixed reports whether the limit cannot move (minimum = maximum).
func (s Settings) Fixed() bool { return s.Minimum == s.Maximum }

// Window is one window of latency samples, what a controller learns from.
type Window struct {
	// RTT is the window's mean latency; Min its least.
	RTT, Min time.Duration
	// InFlight is the most requests in flight when a sample's request was
	// admitted.
	InFlight int64
	// Samples is how many latencies the window holds.
	Samples int
	// Quiet is the mean latency of the window's quiet samples, QuietN how
	// many: those of requests admitted with at most 1/quietShare of the
	// limit in flight, too few to queue at an upstream the limit fits.
	Quiet  time.Duration
	QuietN int
}

// quietShare: a request admitted with at most 1/quietShare of the limit in
// flight is quiet (Window.Quiet).
const quietShare = 4

// controller turns a window into a new limit. Its state is guarded by the
// Limiter's lock.
type controller interface {
	// update returns the limit after window w, from the limit before.
	update(w Window, limit float64) float64
	// baseline is the latency the controller takes for unloaded.
	baseline() time.Duration
}

func newController(s Settings) controller {
	switch s.Controller {
	case Vegas:
		return &vegas{probeEvery: 30}
	case Gradient2:
		return &gradient2{tolerance: s.Tolerance, smoothing: s.Smoothing}
	}
	return &aimd{tolerance: s.Tolerance, minimum: float64(s.Minimum)}
}

// gradient2 is Netflix's Gradient2Limit: a long-term average latency
// (the baseline, an exponential average over longWindow windows) against
// the window's; the limit follows the gradient tolerance×long/short,
// clamped to [0.5, 1], plus a small queue allowance. The baseline is
// never re-measured by lowering the limit: it decays towards the short
// latency when that falls below half of it.
type gradient2 struct {
	tolerance, smoothing float64
	long                 float64 // ns; 0 until the first window
	n                    int     // windows seen, for the warm-up
}

const gradient2Long = 600 // windows the long average spans

func (g *gradient2) update(w Window, limit float64) float64 {
	short := float64(w.RTT)
	if g.n < 10 { // warm-up: a plain mean
		g.n++
		g.long += (short - g.long) / float64(g.n)
	} else {
		g.long += (short - g.long) / gradient2Long
	}
	if g.long/short > 2 {
		g.long *= 0.95 // the upstream got faster: follow it down
	}
	gradient := max(0.5, min(1, g.tolerance*g.long/short))
	next := limit*gradient + queueAllowance(limit)
	return limit*(1-g.smoothing) + next*g.smoothing
}

func (g *gradient2) baseline() time.Duration { return time.Duration(g.long) }

// queueAllowance is how far gradient2 grows past the limit the gradient
// keeps: a little room to find more capacity.
func queueAllowance(limit float64) float64 { return max(1, math.Sqrt(limit)/2) }

// vegas is Netflix's VegasLimit (after TCP Vegas): the requests queued at
// the upstream are estimated as inFlight×(1 − baseline/rtt), the baseline
// the least latency seen (Netflix's counts the limit in flight, which a
// load below it never reaches); few queued: grow, many: shrink. The baseline is
// re-measured every probeEvery×limit windows by taking the next window's
// least latency as the new one, which refuses nothing.
type vegas struct {
	noLoad     time.Duration
	probeEvery int
	windows    int
}

func (v *vegas) update(w Window, limit float64) float64 {
	v.windows++
	if v.noLoad == 0 || w.RTT < v.noLoad || v.windows > v.probeEvery*int(max(limit, 1)) {
		if v.windows > v.probeEvery*int(max(limit, 1)) {
			v.windows = 0
		}
		v.noLoad = w.RTT
		return limit
	}
	log := max(1, math.Log10(limit))
	queue := math.Ceil(float64(w.InFlight) * (1 - float64(v.noLoad)/float64(w.RTT)))
	switch {
	case queue <= log:
		return limit + 6*log
	case queue < 3*log:
		return limit + log
	case queue > 6*log:
		return limit - log
	}
	return limit
}

func (v *vegas) baseline() time.Duration { return v.noLoad }

// aimd grows the limit by one per window and cuts it to aimdCut of itself
// when the window shows a queue at the upstream (queued). The baseline is
// the average latency of the quiet samples (Window.Quiet) of the unloaded
// windows: the app-limited ones (the upstream as it is when we do not load
// it), and every sample of those with the limit within one of its minimum
// (the least load the controller can put on it). A plain mean of the first
// 1/aimdSampleWeight samples, then an exponential one. Quiet samples, not
// the whole window: at 0.8× a burst queues, and the samples admitted into
// it would raise the baseline with the queue it is there to measure.
// Sustained load leaves the baseline alone (Envoy's minRTT drift), a
// slower upstream is followed at once (follow), and measuring it never
// lowers the limit. Until the first unloaded window the baseline is the
// least of the window means' exponential average (weight aimdSmooth): a
// zone that starts in overload cuts its limit while the latency falls.
type aimd struct {
	tolerance float64
	minimum   float64
	avg       float64 // the baseline's average, ns
	n         int     // the samples averaged
	base      time.Duration
	smooth    float64 // the window means' average until the first unloaded window, ns
	// run counts the samples of the unloaded windows in a row past
	// tolerance, runSum their sum (ns); skipN and skipSum are those of the
	// run's first window.
	run, skipN      int
	runSum, skipSum float64
}

// aimdSampleWeight is the weight of a quiet sample in the baseline once
// 1/n is below it; aimdCut is what a slow window leaves of the limit;
// aimdRun is how many samples of a run past tolerance (after its first
// window) move the baseline to their mean if it is past aimdShift × the
// average; aimdQueue is the requests queued past which a window is slow;
// aimdSmooth is the weight of a window in the average the baseline starts
// from.
const (
	aimdSampleWeight = 0.004
	aimdCut          = 0.8
	aimdRun          = 20
	aimdShift        = 1.3
	aimdQueue        = 2.0
	aimdSmooth       = 0.5
)

func (a *aimd) update(w Window, limit float64) float64 {
	switch {
	case limit < a.minimum+1:
		a.learn(w.RTT, w.Samples)
	case appLimited(w, limit) && w.QuietN > 0:
		a.learn(w.Quiet, w.QuietN)
	case a.n == 0:
		if a.smooth == 0 {
			a.smooth = float64(w.RTT)
		}
		a.smooth += (float64(w.RTT) - a.smooth) * aimdSmooth
		if a.base == 0 || time.Duration(a.smooth) < a.base {
			a.base = time.Duration(a.smooth)
		}
	}
	if a.queued(w) {
		return limit * aimdCut
	}
	return limit + 1
}

// learn counts k unloaded samples of mean rtt into the baseline.
func (a *aimd) learn(rtt time.Duration, k int) {
	a.n += k
	a.avg += (float64(rtt) - a.avg) * min(1, max(aimdSampleWeight*float64(k), float64(k)/float64(a.n)))
	a.follow(float64(rtt), k)
	a.base = time.Duration(a.avg)
}

// queued reports whether window w shows a queue at the upstream: its mean
// latency past tolerance × baseline, and more than aimdQueue requests
// waiting by Vegas's estimate, in flight × (1 − baseline/latency) (Little's
// law on the time past the baseline). Noise in the mean of a window moves
// that estimate in proportion to what is in flight: a limit far below the
// knee is not cut by a noisy window, one past it by a real queue is.
func (a *aimd) queued(w Window) bool {
	rtt, base := float64(w.RTT), float64(a.base)
	return rtt > a.tolerance*base && float64(w.InFlight)*(1-base/rtt) > aimdQueue
}

// follow counts k unloaded samples of mean rtt (ns) into the run of those
// past tolerance, and once the run holds aimdRun samples after its first
// window and their mean is past aimdShift × the average, moves the
// baseline to that mean and restarts the plain mean from them: the
// upstream got slower for good (a deploy, a busy host), and the average
// would take about 1/aimdSampleWeight samples to say so, cutting the limit
// meanwhile. The first window is left out: it may mix requests served
// before the change. A smaller rise is left to the average: at the knee it
// is a queue estimate under aimdQueue, so it cuts nothing. Only upwards: a
// baseline too low collapses the limit, one too high lets a little more
// queue until the average follows.
func (a *aimd) follow(rtt float64, k int) {
	if rtt <= a.tolerance*a.avg {
		a.run, a.runSum, a.skipN, a.skipSum = 0, 0, 0, 0
		return
	}
	if a.run == 0 {
		a.skipN, a.skipSum = k, rtt*float64(k)
	}
	a.run += k
	a.runSum += rtt * float64(k)
	if n := a.run - a.skipN; n >= aimdRun && (a.runSum-a.skipSum)/float64(n) > aimdShift*a.avg {
		a.avg, a.n = (a.runSum-a.skipSum)/float64(n), n
		a.run, a.runSum, a.skipN, a.skipSum = 0, 0, 0, 0
	}
}

func (a *aimd) baseline() time.Duration { return a.base }

// appLimited reports whether window w had fewer than half the limit in
// flight: the client, not the upstream, limited it, so it does not show
// the limit to be too low (RFC 7661's rule for TCP's window).
func appLimited(w Window, limit float64) bool { return float64(w.InFlight)*2 < limit }

// Limiter is one key's adaptive limit: Acquire and Release count its
// requests in flight against the limit, Observe feeds their latencies to
// the controller. Safe for concurrent use; Acquire and Release take no
// lock.
type Limiter struct {
	limit    atomic.Int64
	inFlight atomic.Int64
	base     atomic.Int64 // the controller's baseline, ns
	last     atomic.Int64 // the last closed window's mean latency, ns
	refused  atomic.Int64 // refusals since the last window closed
	fixed    bool

	mu    sync.Mutex
	s     Settings
	ctl   controller
	est   float64 // the limit, unrounded
	start time.Duration
	rtts  [windowSamples]time.Duration
	n     int
	// quiet sums the window's quiet samples (Window.Quiet), quietN counts
	// them.
	quiet  time.Duration
	quietN int
	inMax  int64
	// fresh counts the window's samples of requests admitted since fellAt,
	// when the limit last fell.
	fresh  int
	fellAt time.Duration
}

// NewLimiter returns a key's limiter at s.Initial; s must be resolved.
func NewLimiter(s Settings) *Limiter {
	l := &Limiter{s: s, ctl: newController(s), est: float64(s.Initial), fixed: s.Fixed(), fellAt: math.MinInt64}
	l.limit.Store(s.Initial)
	return l
}

// SetLimit sets the limit (clamped to the bounds), as a reload that keeps
// a learned limit does.
func (l *Limiter) SetLimit(n int64) {
	l.mu.Lock()
	n = min(max(n, l.s.Minimum), l.s.Maximum)
	l.est = float64(n)
	l.limit.Store(n)
	l.mu.Unlock()
}

// Acquire takes a place in flight if fewer than the limit are; it returns
// the requests in flight with this one, or 0 when refused.
func (l *Limiter) Acquire() int64 {
	for {
		n := l.inFlight.Load()
		if n >= l.limit.Load() {
			l.refused.Add(1)
			return 0
		}
		if l.inFlight.CompareAndSwap(n, n+1) {
			return n + 1
		}
	}
}

// Force takes a place in flight whatever the limit (report only: it
// learns, never refuses), returning the requests in flight with it.
func (l *Limiter) Force() int64 { return l.inFlight.Add(1) }

// Release gives a place in flight back.
func (l *Limiter) Release() { l.inFlight.Add(-1) }

// Limit returns the current limit.
func (l *Limiter) Limit() int64 { return l.limit.Load() }

// InFlight returns the requests in flight.
func (l *Limiter) InFlight() int64 { return l.inFlight.Load() }

// Baseline returns the controller's baseline latency (0: none yet).
func (l *Limiter) Baseline() time.Duration { return time.Duration(l.base.Load()) }

// Latency returns the last window's mean latency (0: none yet).
func (l *Limiter) Latency() time.Duration { return time.Duration(l.last.Load()) }

// Observe records the latency rtt of a request admitted with inFlight in
// flight, at now (any monotonic clock: a duration since a fixed instant),
// and closes the window when it is old and full enough, updating the
// limit. It reports whether the limit was updated. Whatever the
// controller, an app-limited window does not raise the limit, and a window
// lowers it only if the limit bound (a request was refused or took its
// last place) and at least 1/freshShare of its samples are of requests
// admitted since the limit last fell: once per round trip, as TCP.
func (l *Limiter) Observe(now, rtt time.Duration, inFlight int64) bool {
	if rtt <= 0 {
		rtt = 1
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 {
		l.start = now
	}
	l.rtts[l.n] = rtt
	l.n++
	l.inMax = max(l.inMax, inFlight)
	if float64(inFlight)*quietShare <= l.est {
		l.quiet += rtt
		l.quietN++
	}
	if now-rtt >= l.fellAt {
		l.fresh++
	}
	if l.n < windowSamples && (l.n < minWindowSamples || now-l.start < l.s.Window) {
		return false
	}
	w := Window{InFlight: l.inMax, Samples: l.n, QuietN: l.quietN}
	if l.quietN > 0 {
		w.Quiet = l.quiet / time.Duration(l.quietN)
	}
	var sum time.Duration
	w.Min = l.rtts[0]
	for _, r := range l.rtts[:l.n] {
		sum += r
		w.Min = min(w.Min, r)
	}
	w.RTT = sum / time.Duration(l.n)
	refused, fresh := l.refused.Swap(0), l.fresh
	l.n, l.inMax, l.fresh, l.quiet, l.quietN = 0, 0, 0, 0, 0
	l.last.Store(int64(w.RTT))
	next := l.ctl.update(w, l.est)
	bound := refused > 0 || w.InFlight >= l.limit.Load()
	switch {
	case next > l.est && appLimited(w, l.est):
		next = l.est
	case next < l.est && (!bound || fresh*freshShare < w.Samples):
		next = l.est
	case next < l.est:
		l.fellAt = now
	}
	if !l.fixed {
		l.est = min(max(next, float64(l.s.Minimum)), float64(l.s.Maximum))
		l.limit.Store(int64(math.Round(l.est)))
	}
	l.base.Store(int64(l.ctl.baseline()))
	return true
}
