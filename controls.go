package sluice

import (
	"slices"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// A control is one thing a zone can do to a request (a rate, concurrency
// slots, a delay, a count, a pass, a penalty, a wait for charges in
// flight). Each lives in its own file, with its config checks (compile),
// what it needs of the handler and the store (provision), its hooks into
// the stages of an admission (admission.go) and its admin view. At
// Provision each control says which stages it joins for the handler, and
// only those hooks run. docs/architecture.md shows where each plugs in.
type control struct {
	name string
	// compile checks the control's fields of cfg and compiles them into z;
	// the errors name the field (the caller names the zone).
	compile func(z *zone, cfg *Zone) error
	// provision checks what the control needs of h (its store), sets its
	// fields of the zones' planned requests (h.planned) and returns the
	// stages it joins in h, none for a directive that does not use it. It
	// runs once the zones are compiled, and reads nothing another control's
	// provision sets: the controls may be provisioned in any order.
	provision func(h *Handler) (stages, error)
	// derive returns further stages the control joins, decided from the
	// planned requests' fields once every control has set its own.
	derive func(h *Handler) stages
	// cleanup undoes what provision registered outside h.
	cleanup func(h *Handler)
	// admin adds the control's fields to a zone's admin listing.
	admin func(z *zone, info *adminZoneInfo)
	// layer wraps the decide stage of h in a layer of the control's (or
	// returns next when h does not use it); run once at Provision.
	layer func(h *Handler, next decider) decider
	hooks
}

// hooks are a control's parts in the stages of an admission, each called
// only when the control joined that stage (nil: it has no part). They run
// on the hot path: no allocation, no fmt.
type hooks struct {
	// prepare runs before the zones are planned (a field of the request's
	// body read for the keys); an error ends the request.
	prepare func(a *admission) error
	// plan fills in the request of zone z (a holder id).
	plan func(a *admission, z *zone, rq *algorithms.Request)
	// admit runs once the zones are planned, before the store call.
	admit func(a *admission)
	// decided runs on the store's decisions, before the verdict; an error
	// goes to the fail policy, or ends the request (a client gone).
	decided func(a *admission) error
	// rank adjusts the decisions before they are ranked.
	rank func(a *admission)
	// verdict completes an allowed request's verdict.
	verdict func(a *admission)
	// serve runs before the next handlers, on an allowed request and on an
	// unmetered one (a.out tells which); an error refuses the request.
	serve func(a *admission) error
	// status runs once the response's status is known (a.wantsStatus).
	status func(a *admission, status int)
	// body runs on the response's body as it is written, after the client
	// was written to (a.wantsBody); p must not be kept.
	body func(a *admission, p []byte)
	// exit runs on every exit of an allowed request.
	exit func(a *admission)
}

// stage is a step of an admission a control may join.
type stage uint8

const (
	atPrepare stage = iota
	atPlan
	atAdmit
	atDecided
	atRank
	atVerdict
	atServe
	atStatus
	atBody
	atExit
	numStages
)

// stages is a set of stages.
type stages uint16

// joins returns the set of the stages given.
func joins(sts ...stage) stages {
	var set stages
	for _, s := range sts {
		set |= 1 << s
	}
	return set
}

// hookAt reports whether c has a hook for stage s.
func (c *control) hookAt(s stage) bool {
	switch s {
	case atPrepare:
		return c.prepare != nil
	case atPlan:
		return c.plan != nil
	case atAdmit:
		return c.admit != nil
	case atDecided:
		return c.decided != nil
	case atRank:
		return c.rank != nil
	case atVerdict:
		return c.verdict != nil
	case atServe:
		return c.serve != nil
	case atStatus:
		return c.status != nil
	case atBody:
		return c.body != nil
	case atExit:
		return c.exit != nil
	}
	return false
}

// controls is the registration table: one line per control, in the order
// their hooks run within a stage (pass marks before delay waits; count and
// settle settle before inflight wakes a waiter; settle's verdict follows
// count's). A slice: a test may append a control of its own.
var controls = []*control{
	&penaltyControl,     // penalty.go
	&countControl,       // count.go
	&settleControl,      // settle.go
	&passControl,        // pass.go
	&delayControl,       // delay.go
	&inflightControl,    // inflight.go
	&concurrencyControl, // concurrency.go
	&adaptiveControl,    // adaptive.go
	&requestJSONControl, // requestjson.go
}

// compileControls runs every control's config checks on zone z.
func compileControls(z *zone, cfg *Zone) error {
	for _, c := range controls {
		if c.compile != nil {
			if err := c.compile(z, cfg); err != nil {
				return err
			}
		}
	}
	return nil
}

// provisionControls asks each control which stages it joins in h, and
// lists, per stage, the controls that joined it with a hook for it (h.on).
// Called by Provision once the zones are compiled.
func (h *Handler) provisionControls() error {
	return h.provisionIn(controls)
}

// provisionIn provisions the controls in the order given, then derives
// what follows from the planned requests: further stages (derive), and
// whether the directive's requests may call the store after their
// decision (h.pin). Within a stage the hooks run in the table's order,
// whatever the order given.
func (h *Handler) provisionIn(order []*control) error {
	joined := make([]stages, len(controls))
	for _, c := range order {
		if c.provision == nil {
			continue
		}
		set, err := c.provision(h)
		if err != nil {
			return err
		}
		joined[slices.Index(controls, c)] |= set
	}
	for i, c := range controls {
		if c.derive != nil {
			joined[i] |= c.derive(h)
		}
	}
	h.pin = nil
	if ps, ok := h.store.(storePinner); ok && slices.ContainsFunc(h.planned, givenBack) {
		h.pin = ps
	}
	h.on = [numStages][]*control{}
	for s := range numStages {
		for i, c := range controls {
			if joined[i]&(1<<s) != 0 && c.hookAt(s) {
				h.on[s] = append(h.on[s], c)
			}
		}
	}
	return nil
}

// givenBack reports whether a planned request's charge may be given back
// or settled after its decision: the store is then kept open across a
// reload while the directive's requests use it (storePinner).
func givenBack(rq algorithms.Request) bool {
	return rq.Refundable || rq.InFlight
}

// chargesInFlight reports whether a directive's planned requests leave
// charges in flight (inflight.go).
func chargesInFlight(planned []algorithms.Request) bool {
	return slices.ContainsFunc(planned, func(rq algorithms.Request) bool { return rq.InFlight })
}

// cleanupControls undoes what the controls registered at Provision.
func (h *Handler) cleanupControls() {
	for _, c := range controls {
		if c.cleanup != nil {
			c.cleanup(h)
		}
	}
}

// adminControls adds every control's fields to a zone's admin listing.
func adminControls(z *zone, info adminZoneInfo) adminZoneInfo {
	for _, c := range controls {
		if c.admin != nil {
			c.admin(z, &info)
		}
	}
	return info
}
