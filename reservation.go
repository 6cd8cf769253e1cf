package sluice

import (
	"context"
	"slices"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// reservation is what the store that decided an admitted request charged
// it, zone by zone, and the one path that gives it back (give), as
// golang.org/x/time/rate's Reservation has one Cancel. Each charge carries
// the control it belongs to (its giver), which says what giving it back
// means on each occasion; the reservation only batches the store calls.
// Each charge goes back once, into the store that took it. Pooled with its
// admission.
type reservation struct {
	// store is the store that decided: the handler's, or the fail-local
	// memory store after a failover.
	store   Store
	charges []charge
	// give's buffers.
	refunds []algorithms.Refund
	slots   []algorithms.Request
}

// charge is one zone's part of a reservation.
type charge struct {
	zone *zone
	req  algorithms.Request
	at   int64 // the decision's At
	// back is the control whose charge it is (the zone's giver; nil: a
	// rate charge, given back only when the request is called off).
	back giver
	// since is when its control began holding it (a slot), zero while not
	// held; done: given back.
	since time.Time
	done  bool
}

// giver is a control's side of its charges: what giving charge c back
// means on an occasion (why, with the response's status for giveStatus).
// It returns what c comes to, and completes r (c's refund, kept false)
// for a refund. Called on the hot path: no allocation.
type giver interface {
	give(c *charge, why giving, status int, r *algorithms.Refund) gift
}

// gift is what a charge comes to on an occasion.
type gift uint8

const (
	// keep: nothing now.
	keep gift = iota
	// refund: r goes back (a Refund, or a Settle when r.Settle).
	refund
	// release: the charge's slot is released.
	release
)

// The occasions of give (a bit set), each named for who gives; what each
// means for a charge is its control's to say.
type giving uint8

const (
	// giveStatus: the response's status is known.
	giveStatus giving = 1 << iota
	// giveCancel: the request is called off after the store charged it
	// (a waiter's client left, a fail-local zone refused).
	giveCancel
	// giveRelease: the request ended: what it holds goes back.
	giveRelease
	// giveSettle: the request ended: what it owes is settled.
	giveSettle
)

// rateCharge is a charge without a control of its own: given back, whole,
// only when the request is called off.
type rateCharge struct{}

func (rateCharge) give(_ *charge, why giving, _ int, _ *algorithms.Refund) gift {
	if why&giveCancel != 0 {
		return refund
	}
	return keep
}

// reserve records the charges of the zones that allowed a request (a
// report-only zone that would refuse was not charged), but those at skip
// (a fail-local give-back's own zones), into store.
func (rs *reservation) reserve(store Store, reqs []algorithms.Request, decs []algorithms.Decision, zones []*zone, skip []int) {
	rs.store = store
	for i := range reqs {
		if !decs[i].Allowed || slices.Contains(skip, i) {
			continue
		}
		back := zones[i].giver
		if back == nil {
			back = rateCharge{}
		}
		rs.charges = append(rs.charges, charge{zone: zones[i], req: reqs[i], at: decs[i].At, back: back})
	}
}

// give gives back what the charges' controls say comes back on the
// occasion why and was not given back yet, in one call per kind (Refund,
// or Settle when a charge is settled to an amount; Release) into the store
// that decided. The stores never block on the network: a remote one
// queues the call. A refund's error is the store's to count; Release's is
// returned (a slot not released ends with its lease).
func (rs *reservation) give(why giving, status int) error {
	rs.refunds, rs.slots = rs.refunds[:0], rs.slots[:0]
	settles := false
	for i := range rs.charges {
		c := &rs.charges[i]
		if c.done {
			continue
		}
		r := refundOf(c, false)
		switch c.back.give(c, why, status, &r) {
		case refund:
			rs.refunds = append(rs.refunds, r)
			settles = settles || r.Settle
		case release:
			rs.slots = append(rs.slots, c.req)
		default:
			continue
		}
		c.done = true
	}
	if len(rs.refunds) > 0 {
		if st, ok := rs.store.(settler); ok && settles {
			_ = st.Settle(context.Background(), rs.refunds)
		} else if rf, ok := rs.store.(refunder); ok {
			_ = rf.Refund(context.Background(), rs.refunds)
		}
		clear(rs.refunds)
	}
	var err error
	if len(rs.slots) > 0 {
		if rl, ok := rs.store.(releaser); ok {
			err = rl.Release(context.Background(), rs.slots)
		}
		clear(rs.slots)
	}
	return err
}

// refundOf is the refund of charge c; keep leaves it charged (settling it
// if it was in flight).
func refundOf(c *charge, keep bool) algorithms.Refund {
	r := &c.req
	return algorithms.Refund{Zone: r.Zone, Key: r.Key, Limit: r.Limit, Cost: r.Cost, At: c.at, InFlight: r.InFlight, Keep: keep}
}

// reset empties the reservation, keeping its buffers.
func (rs *reservation) reset() {
	clear(rs.charges)
	rs.charges = rs.charges[:0]
	rs.store = nil
}
