package sluice

import (
	"bytes"
	"errors"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// settleControl: a zone that charges what the response reports (`settle
// header <name>`, `settle json <path>...`). The request takes its cost, the
// estimate, with its other zones (so a spent budget refuses it
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
	// among the header map's trailers; paths the json source's paths, each
	// as its segments, term the term of the sum each belongs to, terms
	// how many; optional the terms that count 0 when absent, a bit each.
	header, trailer string
	paths           [][]string
	term            []uint8
	terms           int
	optional        uint8
	spec            string
	// free: the statuses whose estimate is given back whole.
	free *statusSet
	// settled counts the units settled; missing, the responses without a
	// usable amount (nil without metrics).
	settled, missing prometheus.Counter
	log              *sampledLog
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
	free, err := parseStatuses("settle: free", s.FreeStatuses())
	if err != nil {
		return err
	}
	sz := &settleZone{spec: s.String(), free: free, log: newSampledLog(1, badValueInterval), asks: s.Asks()}
	if err := sz.unknown.compile(s); err != nil {
		return err
	}
	paths, terms, optional := s.Paths()
	sz.paths, sz.optional = paths, optional
	for _, t := range terms {
		sz.term = append(sz.term, uint8(t))
		sz.terms = t + 1
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
			z.settle.settled = metrics.settled.WithLabelValues(z.name)
			z.settle.missing = metrics.settleMissing.WithLabelValues(z.name)
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
	// body: how the body is read, decided at its first bytes.
	body bodyKind
	// json scans the body's JSON, or the current event's data or line's,
	// one scan per path.
	json [zonemodel.MaxSettlePaths]jsonScan
	sse  sseLines
	// got: the terms whose value was read (vals), a bit each; badAt: those
	// whose value was unusable, and none read since.
	got, badAt uint8
	vals       [zonemodel.MaxSettleTerms]int64
	// found: an amount was read (value, the paths' sum); bad: an unusable
	// one was.
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

type bodyKind uint8

const (
	bodyUnknown bodyKind = iota
	bodyJSON
	bodyEvents
	bodyLines      // NDJSON: a JSON text per line
	bodyCompressed // not read: see startSettle
)

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
		rd.resetScans()
		c.back = rd
	}
	if st != nil {
		a.settling = st
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
	if a.settling != nil {
		a.settling.status = status
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
		if st.reads[i].sz.paths != nil {
			return true
		}
	}
	return false
}

// readUsage reads p, the next bytes the client was sent (body).
func readUsage(a *admission, p []byte) {
	st := a.settling
	if st == nil {
		return
	}
	st.seen += int64(len(p))
	for i := 0; i < st.n; i++ {
		rd := &st.reads[i]
		if rd.sz.paths == nil {
			continue
		}
		if rd.body == bodyUnknown {
			rd.body = bodyJSON
			switch ct := a.header.Get("Content-Type"); {
			case eventStream(ct):
				rd.body = bodyEvents
			case ndjsonStream(ct):
				rd.body = bodyLines
			}
			if ce := a.header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
				rd.body = bodyCompressed
			}
		}
		switch rd.body {
		case bodyEvents:
			rd.sse.feed(rd, p)
		case bodyLines:
			rd.feedLines(p)
		case bodyJSON:
			rd.feed(p, true)
		}
	}
}

// ndjsonStream reports whether a Content-Type is a stream of JSON lines
// (application/x-ndjson, Ollama's; application/jsonl).
func ndjsonStream(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.TrimSpace(ct)
	return strings.EqualFold(ct, "application/x-ndjson") || strings.EqualFold(ct, "application/jsonl")
}

// finishSettle settles the request's settle zones to the amounts read, or
// keeps their estimates, in one store call, and wakes the requests waiting
// for charges in flight (exit).
func finishSettle(a *admission) {
	st := a.settling
	if st == nil {
		return
	}
	a.settling = nil
	hdr := a.header
	for i := 0; i < st.n; i++ {
		rd := &st.reads[i]
		c := &a.res.charges[rd.charge]
		if c.done {
			continue // given back (a waiter's client left)
		}
		if st.status == statusRefusal || st.status > 0 && rd.sz.free.has(st.status) {
			// A later rate_limit refused it (the upstream never saw it),
			// or the upstream answered a status it does not bill.
			rd.freed = true
			if m := c.zone.metrics; m != nil {
				m.refunded.Inc()
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
		case rd.body == bodyCompressed:
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
		if ce := rd.sz.log.check(a.h.logger, zap.WarnLevel, reason, time.Now()); ce != nil {
			rd.sz.log.write(ce, zap.String("zone", c.zone.name), zap.String("settle", rd.sz.spec), zap.Int("status", st.status),
				zap.Int64("estimate", c.req.Cost), zap.Int64("charged", charged), zap.String("rule", rule))
		}
	}
	_ = a.res.give(giveSettle, 0) // refunds only: no error
	chargesSettled(a)
	settlementPool.Put(st)
}

// result completes the read once the response has ended: a header, else a
// trailer; the JSON body's or the last line's end, and the terms' sum,
// an amount once every term not optional was told.
func (rd *usageRead) result(hdr http.Header) {
	if rd.sz.paths == nil {
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
		return
	}
	switch rd.body {
	case bodyJSON:
		rd.endText(true)
	case bodyLines:
		rd.endText(false)
	}
	var sum int64
	for i := range rd.sz.terms {
		if rd.got&(1<<i) != 0 {
			sum += rd.vals[i]
		}
	}
	all := uint8(1)<<rd.sz.terms - 1
	rd.bad = rd.badAt != 0 || sum > maxSettled
	rd.found, rd.value = rd.got != 0 && (rd.got|rd.sz.optional)&all == all && !rd.bad, sum
}

// resetScans readies the scans for a new text (the body, an event, a
// line).
func (rd *usageRead) resetScans() {
	for i, p := range rd.sz.paths {
		rd.json[i].reset(p)
	}
}

// feed scans p, the next bytes of the body's JSON (whole: the bytes after
// its end are not read), or of the current event's or line's (which must
// hold one JSON text and nothing else).
func (rd *usageRead) feed(p []byte, whole bool) {
	for i := range rd.sz.paths {
		if j := &rd.json[i]; !j.failed && !(whole && j.done) {
			j.feed(p)
		}
	}
}

// scanByte scans one byte of the current event's data.
func (rd *usageRead) scanByte(c byte) {
	for i := range rd.sz.paths {
		if j := &rd.json[i]; !j.failed {
			j.byte(c)
		}
	}
}

// endText ends a text: each term's value in it (its first alternative
// told), if it told one, is the term's: the last text telling it wins. An
// event's or a line's counts only when whole; the body's, whatever was
// read of it (whole).
func (rd *usageRead) endText(whole bool) {
	var told, bad uint8
	for i := range rd.sz.paths {
		j, t := &rd.json[i], rd.sz.term[i]
		bit := uint8(1) << t
		j.end()
		if (whole || !j.failed && j.done) && told&bit == 0 {
			switch {
			case j.found:
				told |= bit
				rd.vals[t] = j.value
			case j.bad:
				bad |= bit
			}
		}
		j.reset(rd.sz.paths[i])
	}
	bad &^= told | rd.got // unusable, and never told
	rd.got |= told
	rd.badAt = (rd.badAt | bad) &^ told
}

// feedLines reads p, the next bytes of an NDJSON stream: each line is a
// JSON text; a line cut by the stream's end counts unless its JSON is
// whole.
func (rd *usageRead) feedLines(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			rd.feed(p, false)
			return
		}
		rd.feed(p[:i], false)
		rd.endText(false)
		p = p[i+1:]
	}
}

// parseAmount parses a whole number from 0 to 2^53.
func parseAmount(v string) (int64, bool) {
	if v == "0" {
		return 0, true
	}
	n, ok := parseCount([]byte(v))
	return n, ok && n <= maxSettled
}

// sseLines reads a text/event-stream: the data: lines of each event go to
// the read's JSON scan, and an event that ends (a blank line) with the
// amount at the path in its data is the read's amount so far: the last
// one wins. An event cut short by the stream's end counts for nothing.
type sseLines struct {
	st sseState
	// at is how much of "data:" the line has matched; data: the event has
	// data lines; cr: the last byte was a CR (a CRLF's LF follows).
	at       int
	data, cr bool
}

type sseState uint8

const (
	sseLineStart sseState = iota
	sseField              // matching "data:"
	sseDataStart          // after "data:": one optional space
	sseData               // in a data line
	sseSkip               // in another field's line
)

// feed reads p into rd.
func (s *sseLines) feed(rd *usageRead, p []byte) {
	const field = "data:"
	for i := 0; i < len(p); i++ {
		c := p[i]
		if s.st == sseData && c != '\n' && c != '\r' {
			// The rest of the data line at once.
			j := bytes.IndexAny(p[i:], "\r\n")
			if j < 0 {
				j = len(p) - i
			}
			rd.feed(p[i:i+j], false)
			s.cr = false
			i += j - 1
			continue
		}
		if s.cr && c == '\n' {
			s.cr = false
			continue
		}
		s.cr = c == '\r'
		eol := c == '\n' || c == '\r'
		switch s.st {
		case sseLineStart:
			if eol {
				s.event(rd)
				continue
			}
			s.st, s.at = sseField, 0
			fallthrough
		case sseField:
			switch {
			case eol:
				s.st = sseLineStart
			case c == field[s.at]:
				if s.at++; s.at == len(field) {
					s.st = sseDataStart
					if s.data {
						rd.scanByte('\n') // data lines join with a newline
					}
					s.data = true
				}
			default:
				s.st = sseSkip
			}
		case sseDataStart, sseData:
			if eol {
				s.st = sseLineStart
				continue
			}
			if s.st == sseDataStart && c == ' ' {
				s.st = sseData
				continue
			}
			s.st = sseData
			rd.scanByte(c)
		case sseSkip:
			if eol {
				s.st = sseLineStart
			}
		}
	}
}

// event ends an event: the values its data told are the paths'.
func (s *sseLines) event(rd *usageRead) {
	if !s.data {
		return
	}
	rd.endText(false)
	s.data = false
}

// showDebt adds to a settle zone's peek each key's debt: the units owed
// beyond the capacity, from the time the key takes to be back to full
// (token_bucket and gcra; the windows count no debt beyond their window);
// and for those, whether and when a request of the zone's cost (the
// estimate its requests take) passes, as its refusal's Retry-After says.
func (p *adminPeek) showDebt(l algorithms.Limit, cost int64) {
	debt := func(st *adminState) {
		var d int64
		if l.Algorithm == algorithms.TokenBucket || l.Algorithm == algorithms.GCRA {
			perMs := float64(l.Events) / float64(l.Window)
			owed := float64(st.ResetAfterMs) * perMs
			d = max(int64(owed)-l.Capacity(), 0)
			wait := time.Duration(math.Ceil((owed-float64(l.Capacity()-cost))/perMs)) * time.Millisecond
			st.Allowed = wait <= 0
			wait = max(wait, 0)
			st.RetryAfter, st.RetryAfterMs = wait.String(), wait.Milliseconds()
		}
		st.Debt = &d
	}
	debt(&p.adminState)
	for i := range p.Keys {
		debt(&p.Keys[i].adminState)
	}
}
