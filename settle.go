package sluice

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/telemetry"
	"github.com/sluicehq/caddy-sluice/usage"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// settleControl: a zone that charges what the response reports (`settle
// header <name>`, `settle json <path>...`). The request is charged its cost,
// the estimate, with its other zones (so a spent budget refuses it
// atomically); the response's amount is read as the response streams
// through (statuswriter.go hands each body write over after the client's
// own write), and at exit the charge is settled to it in one store call
// (reservation.give, the count zones' path): the difference given back,
// or charged on top. Until then the charge is in flight (inflight.go). A
// response without a usable amount keeps the estimate; one whose status is
// free (default 5xx and 429), or a later rate_limit's refusal, gives it
// back whole.
// algorithms/settle.go says how exact a settle is, per algorithm.
var settleControl = control{
	name:      "settle",
	compile:   compileSettle,
	provision: provisionSettle,
	admin: func(z *zone, info *adminZoneInfo) {
		if z.settle != nil {
			info.Settle = z.settle.spec
		}
	},
	hooks: hooks{
		verdict: startSettle,
		status:  settleStatus,
		body:    readUsage,
		exit:    finishSettle,
	},
}

// settleZone is a zone's compiled settle source.
type settleZone struct {
	// header is the header (or trailer) read, canonical; trailer its name
	// among the header map's trailers; body the json source's paths and
	// their sum (nil for a header).
	header, trailer string
	body            *usage.Spec
	spec            string
	// free: the statuses whose estimate is given back whole.
	free *zonemodel.Statuses
	// settled counts the units settled; missing, the responses without a
	// usable amount (nil without metrics).
	settled, missing prometheus.Counter
	log              *telemetry.SampledLog
	// unknown is the rule charging a response whose amount never arrives
	// (settleunknown.go); asks: the usage is asked for (settleask.go).
	unknown unknownRule
	asks    bool
}

// compileSettle compiles a zone's settle source (zonemodel checked it).
func compileSettle(z *zone, cfg *Zone) error {
	s := cfg.Settle
	if s == nil {
		return nil
	}
	free, err := zonemodel.ParseStatuses("settle: free", s.FreeStatuses())
	if err != nil {
		return err
	}
	sz := &settleZone{spec: s.String(), free: free, log: telemetry.NewSampledLog(1, telemetry.BadValueInterval), asks: s.Asks()}
	if err := sz.unknown.compile(s); err != nil {
		return err
	}
	if paths, terms, optional := s.Paths(); paths != nil {
		sz.body = &usage.Spec{Paths: paths, Optional: optional}
		for _, t := range terms {
			sz.body.Term = append(sz.body.Term, uint8(t))
			sz.body.Terms = t + 1
		}
	}
	if s.Header != "" {
		sz.header = http.CanonicalHeaderKey(s.Header)
		sz.trailer = http.TrailerPrefix + sz.header
	}
	z.settle, z.giver = sz, sz
	return nil
}

// provisionSettle refuses settle zones on a store that cannot settle; with
// one, their charges are refundable and in flight, and the directive's
// requests wait for them like count's (inflight.go).
func provisionSettle(h *Handler) (stages, error) {
	_, canSettle := h.store.(settler)
	settling := false
	for i, z := range h.zones {
		if z.settle == nil {
			continue
		}
		if !canSettle {
			return 0, zoneErr(z.name, errors.New("settle: the store cannot settle charges (use store memory or store redis)"))
		}
		settling = true
		h.planned[i].Refundable, h.planned[i].InFlight = true, true
		if z.metrics != nil {
			z.settle.settled = telemetry.Metrics.Settled.WithLabelValues(z.name)
			z.settle.missing = telemetry.Metrics.SettleMissing.WithLabelValues(z.name)
		}
	}
	if !settling {
		return 0, nil
	}
	return joins(atVerdict, atStatus, atBody, atExit), nil
}

// maxSettleReads bounds the settle zones read per request; a request in
// more keeps the others' estimates.
const maxSettleReads = 4

// settleRequest is settle's part of one admission: the reading of its
// settle zones' amounts, from the verdict to the exit, and the strip of
// the usage event asked for (settleask.go), back to its pool at exit; nil
// for none.
type settleRequest struct {
	reading *settlement
	strip   *usage.Strip
}

// settlement is one request's reading of its settle zones' amounts.
// Pooled.
type settlement struct {
	n     int
	reads [maxSettleReads]usageRead
	// status is the response's (statusRefusal, statusUnknown included:
	// the client left first).
	status int
	// bound is the request's output bound, 0 for none; bodyLen its JSON
	// body's length, the bound of its prompt's tokens (settleask.go);
	// seen the bytes of the response's body read.
	bound, bodyLen, seen int64
}

// usageRead reads one settle zone's amount from a response.
type usageRead struct {
	charge int // in the reservation's charges
	sz     *settleZone
	body   usage.Reader
	// found: an amount was read (value); bad: an unusable one was.
	found, bad bool
	value      int64
	// told: the charge is settled to amount at exit; freed: its status is
	// not charged, the estimate given back; else the estimate stays.
	told, freed bool
	amount      int64
}

// give settles the charge read by rd at exit (reservation.go): to the
// amount told, given back when freed, else kept; given back whole when
// the request is called off.
func (rd *usageRead) give(_ *charge, why giving, _ int, r *algorithms.Refund) gift {
	switch {
	case why&giveCancel != 0:
		return refund
	case why&giveSettle != 0:
		r.Keep = !rd.told && !rd.freed
		r.Settle, r.Settled = rd.told, rd.amount
		return refund
	}
	return keep
}

// give keeps the estimate of a settle zone's charge not read (past
// maxSettleReads) at exit; given back whole when the request is called
// off.
func (*settleZone) give(_ *charge, why giving, _ int, r *algorithms.Refund) gift {
	switch {
	case why&giveCancel != 0:
		return refund
	case why&giveSettle != 0:
		r.Keep = true
		return refund
	}
	return keep
}

// A settle zone's paths and terms fit a usage.Reader.
const _ = uint(usage.MaxPaths-zonemodel.MaxSettlePaths) + uint(usage.MaxTerms-zonemodel.MaxSettleTerms)

var settlementPool = sync.Pool{New: func() any { return new(settlement) }}

// startSettle starts reading the amounts of an allowed request's settle
// zones (verdict).
func startSettle(a *admission) {
	rs := a.reserve()
	var st *settlement
	for i := range rs.charges {
		c := &rs.charges[i]
		if c.zone.settle == nil {
			continue
		}
		if st == nil {
			st = settlementPool.Get().(*settlement)
			st.n, st.status, st.bound, st.bodyLen, st.seen = 0, statusUnknown, 0, 0, 0
		}
		if st.n == maxSettleReads {
			break
		}
		rd := &st.reads[st.n]
		st.n++
		*rd = usageRead{charge: i, sz: c.zone.settle}
		if rd.sz.body != nil {
			rd.body.Reset(rd.sz.body)
		}
		c.back = rd
	}
	if st != nil {
		a.settle.reading = st
		a.wantsStatus, a.wantsBody = true, true
		if ask, read := st.readsRequest(); read {
			readRequest(a, st, ask)
		}
		if st.readsBody() {
			// A compressed body cannot be read as it streams: the
			// upstream (and a later encode) is asked for the body as is.
			a.r.Header.Set("Accept-Encoding", "identity")
		}
	}
}

// settleStatus records the response's status (status).
func settleStatus(a *admission, status int) {
	if a.settle.reading != nil {
		a.settle.reading.status = status
	}
}

// readsRequest reports whether a settle zone reads the request's body:
// ask, one asks for usage (settleask.go); read, that or one whose unknown
// rule may need the request's output bound.
func (st *settlement) readsRequest() (ask, read bool) {
	for i := 0; i < st.n; i++ {
		sz := st.reads[i].sz
		ask = ask || sz.asks
		read = read || sz.asks || sz.unknown.readsRequest()
	}
	return ask, read
}

// readsBody reports whether a settle zone reads the response's body.
func (st *settlement) readsBody() bool {
	for i := 0; i < st.n; i++ {
		if st.reads[i].sz.body != nil {
			return true
		}
	}
	return false
}

// readUsage reads p, the next bytes the client was sent (body).
func readUsage(a *admission, p []byte) {
	st := a.settle.reading
	if st == nil {
		return
	}
	st.seen += int64(len(p))
	for i := 0; i < st.n; i++ {
		rd := &st.reads[i]
		if rd.sz.body == nil {
			continue
		}
		if rd.body.Kind() == usage.Unknown {
			rd.body.Start(usage.KindOf(a.header.Get("Content-Type"), a.header.Get("Content-Encoding")))
		}
		rd.body.Feed(p)
	}
}

// finishSettle settles the request's settle zones to the amounts read, or
// keeps their estimates, in one store call, and wakes the requests waiting
// for charges in flight (exit).
func finishSettle(a *admission) {
	if a.settle.strip != nil { // flushed by then (admission.forward)
		stripPool.Put(a.settle.strip)
		a.settle.strip = nil
	}
	st := a.settle.reading
	if st == nil {
		return
	}
	a.settle.reading = nil
	hdr := a.header
	for i := 0; i < st.n; i++ {
		rd := &st.reads[i]
		c := &a.res.charges[rd.charge]
		if c.done {
			continue // given back (a waiter's client left)
		}
		if st.status == statusRefusal || st.status > 0 && rd.sz.free.Has(st.status) {
			// A later rate_limit refused it (the upstream never saw it),
			// or the upstream answered a status it does not bill.
			rd.freed = true
			if m := c.zone.metrics; m != nil {
				m.Refunded.Inc()
			}
			continue
		}
		rd.result(hdr)
		if rd.found {
			rd.told, rd.amount = true, rd.value
			if rd.sz.settled != nil {
				rd.sz.settled.Add(float64(rd.value))
			}
			continue
		}
		if rd.sz.missing != nil {
			rd.sz.missing.Inc()
		}
		reason := "settle: the response told no amount"
		switch {
		case rd.body.Kind() == usage.Compressed:
			reason = "settle: the response's body came compressed (despite Accept-Encoding: identity), unreadable as it streams"
		case rd.bad:
			reason = "settle: the response told an unusable amount (not a whole number from 0 to 2^53)"
		case a.r.Context().Err() != nil:
			reason = "settle: the client left before the response told its amount"
		}
		charged, rule := c.req.Cost, "the estimate stays (a response that is not 2xx)"
		if st.status == statusUnknown || st.status >= 200 && st.status < 300 {
			charged, rule = rd.sz.unknown.charge(a, st, c.req.Cost), "charged by the unknown rule"
			rd.told, rd.amount = true, charged
		}
		if ce := rd.sz.log.Check(a.h.logger, zap.WarnLevel, reason, time.Now()); ce != nil {
			rd.sz.log.Write(ce, zap.String("zone", c.zone.name), zap.String("settle", rd.sz.spec), zap.Int("status", st.status),
				zap.Int64("estimate", c.req.Cost), zap.Int64("charged", charged), zap.String("rule", rule))
		}
	}
	_ = a.res.give(giveSettle, 0) // refunds only: no error
	chargesSettled(a)
	settlementPool.Put(st)
}

// result completes the read once the response has ended: a header, else a
// trailer; or the body's (usage.Reader.Result).
func (rd *usageRead) result(hdr http.Header) {
	if rd.sz.body != nil {
		rd.value, rd.found, rd.bad = rd.body.Result()
		return
	}
	if hdr == nil {
		return
	}
	v := hdr.Get(rd.sz.header)
	if v == "" {
		v = hdr.Get(rd.sz.trailer)
	}
	if v == "" {
		return
	}
	rd.value, rd.found = parseAmount(strings.TrimSpace(v))
	rd.bad = !rd.found
}

// parseAmount parses a whole number from 0 to 2^53.
func parseAmount(v string) (int64, bool) {
	if v == "0" {
		return 0, true
	}
	n, ok := parseCount([]byte(v))
	return n, ok && n <= algorithms.MaxSettled
}
