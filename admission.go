package sluice

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/reply"
)

// admission is one request through a rate_limit handler, from its plan to
// its exit; ServeHTTP (handler.go) runs its stages in order:
//
//	plan → decide → verdict → respond → serve → forward (status) → exit
//
// The controls (controls.go) join the stages through their hooks. Pooled:
// the hot path allocates nothing for it.
type admission struct {
	h    *Handler
	r    *http.Request
	repl lazyReplacer // r's placeholders

	// plan: one request per zone that applies, in zone order, with its
	// decision once made and what its responses show of its limit.
	reqs  []algorithms.Request
	decs  []algorithms.Decision
	zones []*zone
	shown []*shownLimit
	buf   []byte
	// seat is the waiting room's count this request has a seat in
	// (enterRoom), nil for none.
	seat *atomic.Int64

	// decide: the outcome, and the store that decided; the store call's
	// time, and the error it failed with (the fail policy decided).
	out      outcome
	store    Store
	took     time.Duration
	storeErr error

	// verdict: what ServeHTTP answers with.
	v   verdict
	now time.Time
	// waits: a serve hook waits, in the request's seat in the waiting
	// room; else the seat goes back after the verdict.
	waits bool
	// The controls' per-request state, one slot each: pass.go's, delay.go's
	// (settle's and adaptive's below).
	pass passMark
	turn delayTurn

	// obligations: an allowed request runs the exit hooks (exit). What
	// the store charged it, for the controls that give it back
	// (reservation.go), recorded once (reserved) by those that do; and
	// whether a control waits for the response's status.
	res         reservation
	reserved    bool
	wantsStatus bool
	// wantsBody: a control reads the response's body (atBody).
	wantsBody bool
	// rewrite is a control's rewrite of the response's body on its way to
	// the client, applied by the statusWriter; nil for none.
	rewrite bodyRewrite
	// header is the response's header, for the status and body hooks.
	header http.Header
	// The controls' per-request state, one slot each: settle.go's,
	// adaptive.go's.
	settle settleRequest
	adapt  adaptiveRequest
}

// outcome is what a request's decision and verdict came to.
type outcome uint8

const (
	unmetered  outcome = iota // no zone applies, or the store failed open
	decided                   // the store decided: the verdict ranks
	allow                     // allowed: headers from the verdict
	refuse                    // refused with 429
	failClosed                // the store failed and a fail-closed zone refuses: 503
)

// verdict is the decision a response shows: the most constrained zone.
type verdict struct {
	zone  *zone
	shown *shownLimit
	key   identity.Token
	algorithms.Decision
	// policy and state are the RateLimit-Policy and RateLimit field values
	// (headers draft or both), covering every zone decided.
	policy, state string
	// cost is what the request would have spent in the verdict's zone.
	cost int64
	// violated lists the refusing zones (response problem only), as the
	// members of a JSON array: their policy identifiers, quoted.
	violated string
}

var admissionPool = sync.Pool{New: func() any {
	return &admission{
		reqs:  make([]algorithms.Request, 0, 8),
		decs:  make([]algorithms.Decision, 0, 8),
		zones: make([]*zone, 0, 8),
		shown: make([]*shownLimit, 0, 8),
		buf:   make([]byte, 0, 256),
		res:   reservation{charges: make([]charge, 0, 4)},
		adapt: adaptiveRequest{holds: make([]adaptiveHold, 0, 2)},
	}
}}

// admit starts the admission of r.
func (h *Handler) admit(r *http.Request) *admission {
	a := admissionPool.Get().(*admission)
	a.h, a.r = h, r
	return a
}

// plan keeps the zones whose matchers match r and makes each one request:
// key token, limit and cost, and the controls' fields. An error is this
// handler's own answer (an ambiguous key's 400).
func (a *admission) plan() error {
	h, r := a.h, a.r
	for _, c := range h.on[atPrepare] {
		if err := c.prepare(a); err != nil {
			return err
		}
	}
	a.repl.r = r
	repl := &a.repl
	// Zones with the same key share their deriver (provisionZones): the
	// request's key is derived once for a run of them.
	var last *identity.Deriver
	var lastTok identity.Token
	var lastAmb *identity.Ambiguity
	for i, z := range h.zones {
		if len(z.matchers) > 0 {
			match, err := z.matchers.AnyMatchWithError(r)
			if err != nil {
				return err
			}
			if !match {
				continue
			}
		}
		tok, amb := lastTok, lastAmb
		if z.deriver != last {
			tok, a.buf, amb = z.deriver.DeriveRequest(repl, r, a.buf)
			last, lastTok, lastAmb = z.deriver, tok, amb
		}
		if amb != nil {
			if err := h.ambiguousKey(z, amb); err != nil {
				return err
			}
			continue // report only: this zone decides nothing for the request
		}
		rq := h.planned[i] // the zone's fields, set at Provision
		rq.Key, rq.Limit = tok, z.limit
		shown := &z.shown
		if z.dyn != nil {
			// The limit is chosen per request; a limit other than the
			// default has a bucket of its own (zone.limitOf), and its own
			// header values (zone.shownFor).
			rq.Limit, rq.Key, a.buf = z.limitOf(repl, tok, a.buf, h.logger)
			shown = z.shownFor(rq.Limit)
		}
		rq.Cost, a.buf = z.costOf(repl, a.buf, h.logger)
		a.reqs = append(a.reqs, rq)
		for _, c := range h.on[atPlan] {
			c.plan(a, z, &a.reqs[len(a.reqs)-1])
		}
		a.zones = append(a.zones, z)
		a.shown = append(a.shown, shown)
	}
	return nil
}

// lazyReplacer reads placeholders through the request's replacer, found
// in its context on first use: a zone whose key reads a request field or
// a variable, with a static limit and cost, never needs it.
type lazyReplacer struct {
	r    *http.Request
	repl *caddy.Replacer
}

func (l *lazyReplacer) Get(name string) (any, bool) {
	if l.repl == nil {
		l.repl = l.r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	}
	return l.repl.Get(name)
}

// decide decides every planned zone in one store call (Store.Take),
// through the decide stage's layers (failpolicy.go). No zone: unmetered.
func (a *admission) decide() error {
	if len(a.reqs) == 0 {
		a.out = unmetered
		return nil
	}
	a.sizeDecs()
	for _, c := range a.h.on[atAdmit] {
		c.admit(a)
	}
	return a.h.decider.decide(a)
}

// sizeDecs makes a.decs as long as a.reqs.
func (a *admission) sizeDecs() {
	if n := len(a.reqs); cap(a.decs) < n {
		a.decs = make([]algorithms.Decision, n)
	} else {
		a.decs = a.decs[:n]
	}
}

// verdict ranks the decisions and chooses the verdict to report: the
// refusing zone with the longest Retry-After, else the zone with the least
// remaining. A report-only zone that would refuse does not refuse: it is
// counted and logged, and its numbers still reach the headers. An allowed
// request reserves what it may give back, and the controls complete its
// verdict.
func (a *admission) verdict() {
	if a.out == decided {
		h := a.h
		for _, c := range h.on[atRank] {
			c.rank(a)
		}
		best, top := -1, reply.Standing{}
		for i := range a.decs {
			d := &a.decs[i]
			st := reply.Standing{Refused: !d.Allowed && !a.reqs[i].ReportOnly, Retry: int64(d.RetryAfter), Remaining: d.Remaining, Reset: int64(d.ResetAfter)}
			if best < 0 || st.Tighter(top) {
				best, top = i, st
			}
		}
		refused := top.Refused
		countDecisions(a, refused)
		if !refused {
			h.reportWouldRefuse(a)
		}
		a.v = verdict{zone: a.zones[best], shown: a.shown[best], key: a.reqs[best].Key, Decision: a.decs[best], cost: a.reqs[best].Cost}
		if a.v.Overridden {
			a.v.shown = overriddenShown(a.v.shown, &a.v.Decision) // overrides.go
		}
		if !refused {
			a.out = allow
			for _, c := range h.on[atVerdict] {
				c.verdict(a)
			}
		}
		if h.draft {
			a.v.policy, a.v.state = draftFields(a)
		}
		if refused {
			a.out = refuse
			if h.resp.Problem() {
				a.v.violated = violatedPolicies(a, false)
			}
		}
	}
	if !a.waits {
		a.leaveRoom() // a request that need not wait gives its seat back at once
	}
	if a.now.IsZero() { // not set by the store call (storeCall.decide)
		a.now = time.Now()
	}
}

// reserve records, once, what the store that decided charged an allowed
// request, for the controls that give it back (reservation.go).
func (a *admission) reserve() *reservation {
	if !a.reserved {
		a.res.reserve(a.store, a.reqs, a.decs, a.zones, nil)
		a.reserved = true
	}
	return &a.res
}

// respond sets the rate limit headers of an allowed request.
func (a *admission) respond(w http.ResponseWriter) {
	l := a.v.limits(a.now)
	a.h.resp.SetLimitHeaders(w.Header(), &l)
}

// serve runs the controls' last steps before the next handlers (marks, a
// wait for its turn), on an allowed or unmetered request.
func (a *admission) serve() error {
	for _, c := range a.h.on[atServe] {
		if err := c.serve(a); err != nil {
			return err
		}
	}
	return nil
}

// forward runs the next handlers; when a control waits for the status
// (wantsStatus), with a response writer that reports it (statuswriter.go);
// an exit before the status was written reports the one inferred here.
func (a *admission) forward(w http.ResponseWriter, next caddyhttp.Handler) (err error) {
	if !a.wantsStatus {
		return next.ServeHTTP(w, a.r)
	}
	a.header = w.Header()
	sw := statusWriterPool.Get().(*statusWriter)
	sw.ResponseWriter, sw.hook, sw.known, sw.refused, sw.body = w, a, false, false, a.wantsBody
	returned := false
	defer func() {
		if !sw.known {
			status := http.StatusOK
			switch {
			case a.r.Context().Err() != nil:
				// The client left (or the server gave up on it) before
				// the status was known: whatever the next handlers made
				// of that (reverse_proxy: 499), the request was forwarded.
				status = statusUnknown
			case !returned: // a panic, passed on
				status = http.StatusInternalServerError
			case err != nil:
				status = errorStatus(err)
			}
			sw.noteStatus(status)
		}
		if a.rewrite != nil {
			_ = a.rewrite.Flush(sw.ResponseWriter)
			a.rewrite = nil
		}
		sw.ResponseWriter, sw.hook = nil, nil
		statusWriterPool.Put(sw)
	}()
	err = next.ServeHTTP(sw, a.r)
	returned = true
	return err
}

// bodyWritten is called with each piece of the body written to the client
// (a.wantsBody).
func (a *admission) bodyWritten(p []byte) {
	for _, c := range a.h.on[atBody] {
		c.body(a, p)
	}
}

// statusKnown is called once, with the response's status (statuswriter.go
// says which).
func (a *admission) statusKnown(status int) {
	for _, c := range a.h.on[atStatus] {
		c.status(a, status)
	}
}

// exit runs on every exit of ServeHTTP (an error, a panic, a client gone,
// a stream's end), once the status is known: an allowed request's last
// obligations (the exit hooks: its settlements, its slots back), whether
// or not it reserved anything, then the admission is recycled.
func (a *admission) exit() {
	if a.out == allow { // an allowed request's obligations, whatever it reserved
		for _, c := range a.h.on[atExit] {
			c.exit(a)
		}
	}
	a.leaveRoom()
	a.reqs, a.decs, a.zones, a.shown = a.reqs[:0], a.decs[:0], a.zones[:0], a.shown[:0]
	a.res.reset()
	if cap(a.buf) > 64<<10 {
		a.buf = nil // do not keep a huge key buffer alive
	}
	*a = admission{reqs: a.reqs, decs: a.decs, zones: a.zones, shown: a.shown, buf: a.buf, res: a.res, adapt: a.adapt.recycled()}
	admissionPool.Put(a)
}

// waitingRoom counts the requests of a handler with a seat to wait in
// (n), at most max (max_waiting): those waiting for their turn (delay),
// for charges in flight and for an adaptive place. The stage code owns
// it; a control that waits gets a seat through enterRoom.
type waitingRoom struct {
	n   atomic.Int64
	max int64
}

// defaultMaxWaiting is max_waiting's default.
const defaultMaxWaiting = 1000

// newWaitingRoom returns a room of size seats (0: the default).
func newWaitingRoom(size int) *waitingRoom {
	if size <= 0 {
		size = defaultMaxWaiting
	}
	return &waitingRoom{max: int64(size)}
}

// enter gets a seat in the room, if one is free; the seat goes back
// with n.Add(-1).
func (room *waitingRoom) enter() bool {
	for n := room.n.Load(); n < room.max; n = room.n.Load() {
		if room.n.CompareAndSwap(n, n+1) { // never past max, even for a moment
			return true
		}
	}
	return false
}

// enterRoom gets a seat in the waiting room for the request, unless it
// has one already; false: the room is full. The seat goes back after
// the verdict for a request that need not wait, else at the end of its
// wait or at exit (leaveRoom).
func (a *admission) enterRoom() bool {
	if a.seat != nil {
		return true
	}
	if !a.h.room.enter() {
		return false
	}
	a.seat = &a.h.room.n
	return true
}

// leaveRoom gives the request's seat in the waiting room back, if any.
func (a *admission) leaveRoom() {
	if a.seat != nil {
		a.seat.Add(-1)
		a.seat = nil
	}
}
