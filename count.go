package sluice

import (
	"errors"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// countControl: a zone that counts only some responses (`count 401 403`,
// `count 4xx`). The charge is made in the one Store.Take with the request's
// other zones, so a spent budget refuses atomically, and given back when
// the response's status is known and not counted; never charged afterwards.
// Until then the charge is in flight (inflight.go). algorithms/refund.go
// says how exact a refund is, per algorithm.
var countControl = control{
	name:      "count",
	compile:   compileCount,
	provision: provisionCount,
	admin: func(z *zone, info *adminZoneInfo) {
		if z.count != nil {
			info.Count = z.count.spec
		}
	},
	hooks: hooks{
		verdict: func(a *admission) { a.wantsStatus = awaitsStatus(a.reserve()) },
		status: func(a *admission, status int) {
			_ = a.res.give(giveStatus, status) // refunds only: no error
		},
	},
}

// compileCount compiles the statuses a zone counts.
func compileCount(z *zone, cfg *Zone) error {
	if len(cfg.Count) == 0 {
		return nil
	}
	set, err := zonemodel.ParseStatuses("count", cfg.Count)
	if err != nil {
		return err
	}
	z.count = &countZone{statuses: *set, spec: cfg.Count}
	z.giver = z.count
	return nil
}

// countZone is a count zone's: the response statuses it charges, and the
// setting as written.
type countZone struct {
	statuses zonemodel.Statuses
	spec     []string
}

// give is a count zone's charge given back (reservation.go): once the
// status is known, kept if the zone counts it, else given back; given back
// whole when the request is called off.
func (cz *countZone) give(c *charge, why giving, status int, r *algorithms.Refund) gift {
	switch {
	case why&giveCancel != 0:
		return refund
	case why&giveStatus != 0:
		r.Keep = status == statusUnknown || cz.statuses.Has(status)
		if m := c.zone.metrics; m != nil && !r.Keep {
			m.Refunded.Inc()
		}
		return refund
	}
	return keep
}

// awaitsStatus reports whether a count zone's charge in rs awaits the
// status.
func awaitsStatus(rs *reservation) bool {
	for i := range rs.charges {
		if c := &rs.charges[i]; !c.done {
			if _, ok := c.back.(*countZone); ok {
				return true
			}
		}
	}
	return false
}

// provisionCount refuses count zones on a store that cannot give charges
// back; with one, the count zones' charges are refundable and in flight,
// and the status settles them.
func provisionCount(h *Handler) (stages, error) {
	_, canRefund := h.store.(refunder)
	counting := false
	for i, z := range h.zones {
		if z.count == nil {
			continue
		}
		if !canRefund {
			return 0, zoneErr(z.name, errors.New("count: the store cannot give charges back (use store memory or store redis)"))
		}
		counting = true
		h.planned[i].Refundable, h.planned[i].InFlight = true, true
	}
	if !counting {
		return 0, nil
	}
	return joins(atVerdict, atStatus), nil
}

// The statuses statusKnown is given besides the response's own.
const (
	// statusRefusal: the response is a rate_limit handler's own refusal (a
	// later directive's): no zone counts it.
	statusRefusal = 0
	// statusUnknown: the client left before the status was known: every
	// zone counts it (the request was forwarded; its charge stays).
	statusUnknown = -1
)
