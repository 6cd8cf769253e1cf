package sluice

import (
	"time"

	"github.com/sluicehq/caddy-sluice/admin"
	"github.com/sluicehq/caddy-sluice/identity"
)

// The root's side of package admin (the admin API and the live page): the
// handlers and zones it registers, and the activity it counts.

// adminZoneInfo is a zone in the admin listing, which the controls' admin
// parts fill in (controls.go).
type adminZoneInfo = admin.ZoneInfo

// adminAdaptive is an adaptive zone's part of the listing (adaptive.go).
type adminAdaptive = admin.Adaptive

// adminRegister registers a provisioned handler (h.app set) with the admin
// API.
func adminRegister(h *Handler) {
	zones := make([]admin.Zone, len(h.zones))
	for i, z := range h.zones {
		zones[i] = adminZone(h, z, h.planned[i].InFlight)
	}
	admin.Register(h.app, h, h.enabled, zones)
}

// adminUnregister forgets a handler (a no-op if it was never registered).
func adminUnregister(h *Handler) { admin.Unregister(h) }

// adminZone is zone z of h as the admin API reads it.
func adminZone(h *Handler, z *zone, inFlight bool) admin.Zone {
	az := admin.Zone{Name: z.name, Deriver: z.deriver, Limit: z.limit, Store: h.store, Local: h.local,
		InFlight: inFlight, Info: func() admin.ZoneInfo { return adminInfo(z) },
		MaxOverrides: z.maxOverrides, OverridesInForce: overridesInForce(z.name), Sync: z.sync.cfg != nil}
	if z.conc != nil || z.settle != nil {
		az.Peek = func(p *admin.Peek) {
			if z.conc != nil {
				p.ShowInUse()
			}
			if z.settle != nil {
				p.ShowDebt(z.limit, z.cost)
			}
		}
	}
	return az
}

// adminInfo is zone z's listing but its Enabled and Store (package admin's).
func adminInfo(z *zone) admin.ZoneInfo {
	var keys []string
	for _, c := range z.deriver.Candidates() {
		keys = append(keys, c.String())
	}
	v4, v6 := z.deriver.Prefixes()
	var cost any = z.cost
	if z.costExpr != nil {
		cost = z.costExpr.String()
	}
	info := admin.ZoneInfo{
		Name:       z.name,
		Algorithm:  z.limit.Algorithm.String(),
		Events:     z.limit.Events,
		Window:     (time.Duration(z.limit.Window) * time.Millisecond).String(),
		WindowMs:   z.limit.Window,
		Burst:      z.limit.Burst,
		Capacity:   z.limit.Capacity(),
		Cost:       cost,
		Key:        keys,
		IPv4Prefix: v4,
		IPv6Prefix: v6,
		Fail:       z.fail,
		ReportOnly: z.reportOnly,
	}
	return adminControls(z, info)
}

// recordActivity counts the zones of a decided request (refused: some
// enforcing zone refused it), as countDecisions does for the metrics.
func recordActivity(s *admission, refused bool) {
	var now int64
	for i, z := range s.zones {
		a := admin.ActivityOf(z.name)
		deny := !s.decs[i].Allowed
		switch {
		case deny && s.reqs[i].ReportOnly:
			a.ReportOnly.Add(1)
		case !refused:
			a.Allowed.Add(1)
			continue
		case deny:
			a.Refused.Add(1)
		default:
			a.Vetoed.Add(1)
			continue
		}
		if now == 0 {
			now = time.Now().UnixMilli()
		}
		a.Remember(identity.Token(s.reqs[i].Key), now, s.decs[i].RetryAfter.Milliseconds(), s.reqs[i].ReportOnly && !z.pass.forward, z.pass.forward)
	}
}
