package sluice

import (
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
	// provision checks what the control needs of h (its store) and returns
	// the stages it joins in h, 0 for none. It runs once the zones are
	// compiled, in the order of the table below.
	provision func(h *Handler) (stage, error)
	// cleanup undoes what provision registered outside h.
	cleanup func(h *Handler)
	// admin adds the control's fields to a zone's admin listing.
	admin func(z *zone, info *adminZoneInfo)
	hooks
}

// hooks are a control's parts in the stages of an admission, each called
// only when the control joined that stage (nil: it takes no part). They run
// on the hot path: no allocation, no fmt.
type hooks struct {
	// plan fills in the request of zone z (a holder id).
	plan func(a *admission, z *zone, rq *algorithms.Request)
	// admit runs once the zones are planned, before the take.
	admit func(a *admission)
	// take runs on the store's decisions, before the verdict; an error
	// goes to the fail policy, or ends the request (a client gone).
	take func(a *admission) error
	// rank adjusts the decisions before they are ranked.
	rank func(a *admission)
	// verdict completes an allowed request's verdict.
	verdict func(a *admission)
	// serve runs before the next handlers, on an allowed request and on an
	// unmetered one (a.out tells which); an error refuses the request.
	serve func(a *admission) error
	// status runs once the response's status is known (a.wantsStatus).
	status func(a *admission, status int)
	// exit runs on every exit of an allowed request.
	exit func(a *admission)
}

// stage is a step of an admission a control may join (a bit set).
type stage uint16

const (
	atPlan stage = 1 << iota
	atAdmit
	atTake
	atRank
	atVerdict
	atServe
	atStatus
	atExit
)

// controls is the registration table: one line per control, in the order
// their hooks run within a stage (pass marks before delay waits; count
// settles before inflight wakes a waiter).
var controls = [...]*control{
	&penaltyControl,     // penalty.go
	&countControl,       // count.go
	&passControl,        // pass.go
	&delayControl,       // delay.go
	&inflightControl,    // inflight.go
	&concurrencyControl, // concurrency.go
}

// joined are the hooks of the controls that joined each stage of a
// handler, in table order.
type joined struct {
	plan    []func(a *admission, z *zone, rq *algorithms.Request)
	admit   []func(a *admission)
	take    []func(a *admission) error
	rank    []func(a *admission)
	verdict []func(a *admission)
	serve   []func(a *admission) error
	status  []func(a *admission, status int)
	exit    []func(a *admission)
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

// provisionControls asks each control which stages it joins in h and
// gathers their hooks. Called by Provision once the zones are compiled.
func (h *Handler) provisionControls() error {
	for _, c := range controls {
		if c.provision == nil {
			continue
		}
		st, err := c.provision(h)
		if err != nil {
			return err
		}
		h.stages |= st
		add := func(s stage, ok bool) bool { return st&s != 0 && ok }
		if add(atPlan, c.plan != nil) {
			h.on.plan = append(h.on.plan, c.plan)
		}
		if add(atAdmit, c.admit != nil) {
			h.on.admit = append(h.on.admit, c.admit)
		}
		if add(atTake, c.take != nil) {
			h.on.take = append(h.on.take, c.take)
		}
		if add(atRank, c.rank != nil) {
			h.on.rank = append(h.on.rank, c.rank)
		}
		if add(atVerdict, c.verdict != nil) {
			h.on.verdict = append(h.on.verdict, c.verdict)
		}
		if add(atServe, c.serve != nil) {
			h.on.serve = append(h.on.serve, c.serve)
		}
		if add(atStatus, c.status != nil) {
			h.on.status = append(h.on.status, c.status)
		}
		if add(atExit, c.exit != nil) {
			h.on.exit = append(h.on.exit, c.exit)
		}
	}
	return nil
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
