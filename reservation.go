package sluice

import (
	"context"
	"slices"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// reservation is what the store that decided an admitted request charged
// it, zone by zone, and the one path that gives it back (give), as
// golang.org/x/time/rate's Reservation has one Cancel: a count zone's
// charge when the status is known (settle), every rate charge when a
// waiter's client leaves or a fail-local zone refuses after the store
// decided the others (cancel), the concurrency slots at exit (release).
// Each charge goes back once, into the store that took it. Pooled with its
// admission.
type reservation struct {
	// store is the store that decided: the handler's, or the fail-local
	// memory store after a failover.
	store   Store
	charges []charge
	// held is when the slots were taken; zero while none is held.
	held time.Time
	// give's buffers.
	refunds []algorithms.Refund
	slots   []algorithms.Request
}

// charge is one zone's part of a reservation.
type charge struct {
	zone *zone
	req  algorithms.Request
	at   int64 // the decision's At
	// held: a slot counted in the zone's gauge (hold); done: given back.
	held, done bool
	// told: a settle zone's response told the actual amount, settled
	// (settle.go); freed: its status is not charged, the estimate given
	// back; else its estimate stays.
	told, freed bool
	settled     int64
}

// What give gives back (a bit set).
type giving uint8

const (
	// settleCounts: the count zones' charges, kept when the status counts.
	settleCounts giving = 1 << iota
	// cancelCharges: every rate charge.
	cancelCharges
	// releaseSlots: the concurrency slots.
	releaseSlots
	// settleAmounts: the settle zones' charges, settled to the amounts
	// their responses told (the estimate kept when untold).
	settleAmounts
)

// reserve records the charges of the zones that allowed a request (a
// report-only zone that would refuse was not charged), but those at skip
// (a fail-local give-back's own zones), into store.
func (rs *reservation) reserve(store Store, reqs []algorithms.Request, decs []algorithms.Decision, zones []*zone, skip []int) {
	rs.store = store
	for i := range reqs {
		if !decs[i].Allowed || slices.Contains(skip, i) || zones[i].adapt != nil { // adaptive.go gives its own back
			continue
		}
		rs.charges = append(rs.charges, charge{zone: zones[i], req: reqs[i], at: decs[i].At})
	}
}

// hold counts the reserved slots as held from now (the slots gauge, the
// hold time that feeds the Retry-After hint), and reports whether there
// are any.
func (rs *reservation) hold() bool {
	for i := range rs.charges {
		c := &rs.charges[i]
		if c.zone.conc == nil {
			continue
		}
		if !c.held && c.zone.conc.slots != nil {
			c.zone.conc.slots.Inc()
		}
		c.held = true
		rs.held = time.Now()
	}
	return !rs.held.IsZero()
}

// counted reports whether a count zone's charge awaits the status.
func (rs *reservation) counted() bool {
	for i := range rs.charges {
		if c := &rs.charges[i]; c.zone.counts != nil && c.zone.conc == nil && !c.done {
			return true
		}
	}
	return false
}

// give gives back what is picked and not given back yet, in one call per
// kind (Refund, or Settle when a charge is settled to an amount; Release)
// into the store that decided; status is the response's for settleCounts. The stores never block on the network: a
// remote one queues the call. A refund's error is the store's to count;
// Release's is returned (a slot not released ends with its lease).
func (rs *reservation) give(what giving, status int) error {
	rs.refunds, rs.slots = rs.refunds[:0], rs.slots[:0]
	var slotsHeld time.Duration
	settles := false
	for i := range rs.charges {
		c := &rs.charges[i]
		switch {
		case c.done:
			continue
		case c.zone.conc != nil:
			if what&releaseSlots == 0 {
				continue
			}
			rs.slots = append(rs.slots, c.req)
			if c.held {
				if slotsHeld == 0 {
					slotsHeld = max(time.Since(rs.held), 1)
				}
				c.zone.conc.observe(slotsHeld)
				if c.zone.conc.slots != nil {
					c.zone.conc.slots.Dec()
				}
			}
		case what&cancelCharges != 0:
			rs.refunds = append(rs.refunds, refundOf(c, false))
		case what&settleCounts != 0 && c.zone.counts != nil:
			keep := status == statusUnknown || c.zone.counts.has(status)
			if m := c.zone.metrics; m != nil && !keep {
				m.refunded.Inc()
			}
			rs.refunds = append(rs.refunds, refundOf(c, keep))
		case what&settleAmounts != 0 && c.zone.settle != nil:
			r := refundOf(c, !c.told && !c.freed)
			r.Settle, r.Settled = c.told, c.settled
			rs.refunds = append(rs.refunds, r)
			settles = settles || c.told
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
	rs.store, rs.held = nil, time.Time{}
}
