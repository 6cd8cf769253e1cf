package usage

import (
	"bytes"
	"mime"
	"strings"
)

// MaxPaths bounds the paths a Reader reads, MaxTerms the terms it sums
// (zonemodel.MaxSettlePaths and MaxSettleTerms).
const (
	MaxPaths = 8
	MaxTerms = 4
)

// Spec is what a Reader reads: JSON paths, each as its segments, Term the
// term of the sum each belongs to (alternatives share a term), Terms how
// many; Optional the terms that count 0 when absent, a bit each.
type Spec struct {
	Paths    [][]string
	Term     []uint8
	Terms    int
	Optional uint8
}

// Kind is how a body is read, decided at its first bytes.
type Kind uint8

const (
	Unknown    Kind = iota
	JSON            // one JSON text
	Events          // text/event-stream: a JSON text per event's data
	Lines           // NDJSON: a JSON text per line
	Compressed      // not read
)

// KindOf returns how a body of the Content-Type and Content-Encoding given
// is read.
func KindOf(contentType, contentEncoding string) Kind {
	if contentEncoding != "" && !strings.EqualFold(contentEncoding, "identity") {
		return Compressed
	}
	switch {
	case EventStream(contentType):
		return Events
	case ndjsonStream(contentType):
		return Lines
	}
	return JSON
}

// EventStream reports whether a Content-Type is text/event-stream.
func EventStream(ct string) bool {
	if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream") {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// ndjsonStream reports whether a Content-Type is a stream of JSON lines
// (application/x-ndjson, Ollama's; application/jsonl).
func ndjsonStream(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.TrimSpace(ct)
	return strings.EqualFold(ct, "application/x-ndjson") || strings.EqualFold(ct, "application/jsonl")
}

// Reader reads one amount from a response's body: each term's value, the
// last text telling it winning, summed. Its zero value, Reset, reads
// nothing until Start; it allocates nothing.
type Reader struct {
	spec *Spec
	kind Kind
	// json scans the body's JSON, or the current event's data or line's,
	// one scan per path.
	json [MaxPaths]Scan
	sse  sseLines
	// got: the terms whose value was read (vals), a bit each; badAt: those
	// whose value was unusable, and none read since.
	got, badAt uint8
	vals       [MaxTerms]int64
}

// Reset readies r to read a body for spec.
func (r *Reader) Reset(spec *Spec) {
	*r = Reader{spec: spec}
	r.resetScans()
}

// Kind returns how the body is read (Unknown before Start).
func (r *Reader) Kind() Kind { return r.kind }

// Start sets how the body is read, at its first bytes.
func (r *Reader) Start(k Kind) { r.kind = k }

// Feed reads p, the next bytes of the body.
func (r *Reader) Feed(p []byte) {
	switch r.kind {
	case Events:
		r.sse.feed(r, p)
	case Lines:
		r.feedLines(p)
	case JSON:
		r.feed(p, true)
	}
}

// Result completes the read once the body has ended: the JSON body's or
// the last line's end, and the terms' sum, an amount (found) once every
// term not optional was told; bad, an unusable value was told (or the
// sum is over MaxAmount).
func (r *Reader) Result() (value int64, found, bad bool) {
	switch r.kind {
	case JSON:
		r.endText(true)
	case Lines:
		r.endText(false)
	}
	var sum int64
	for i := range r.spec.Terms {
		if r.got&(1<<i) != 0 {
			sum += r.vals[i]
		}
	}
	all := uint8(1)<<r.spec.Terms - 1
	bad = r.badAt != 0 || sum > MaxAmount
	return sum, r.got != 0 && (r.got|r.spec.Optional)&all == all && !bad, bad
}

// resetScans readies the scans for a new text (the body, an event, a
// line).
func (r *Reader) resetScans() {
	for i, p := range r.spec.Paths {
		r.json[i].Reset(p, false)
	}
}

// feed scans p, the next bytes of the body's JSON (whole: the bytes after
// its end are not read), or of the current event's or line's (which must
// hold one JSON text and nothing else).
func (r *Reader) feed(p []byte, whole bool) {
	for i := range r.spec.Paths {
		if j := &r.json[i]; !j.failed && !(whole && j.done) {
			j.Feed(p)
		}
	}
}

// scanByte scans one byte of the current event's data.
func (r *Reader) scanByte(c byte) {
	for i := range r.spec.Paths {
		if j := &r.json[i]; !j.failed {
			j.byte(c)
		}
	}
}

// endText ends a text: each term's value in it (its first alternative
// told), if it told one, is the term's: the last text telling it wins. An
// event's or a line's counts only when whole; the body's, whatever was
// read of it (whole).
func (r *Reader) endText(whole bool) {
	var told, bad uint8
	for i := range r.spec.Paths {
		j, t := &r.json[i], r.spec.Term[i]
		bit := uint8(1) << t
		j.End()
		if (whole || !j.failed && j.done) && told&bit == 0 {
			switch {
			case j.found:
				told |= bit
				r.vals[t] = j.value
			case j.bad:
				bad |= bit
			}
		}
		j.Reset(r.spec.Paths[i], false)
	}
	bad &^= told | r.got // unusable, and never told
	r.got |= told
	r.badAt = (r.badAt | bad) &^ told
}

// feedLines reads p, the next bytes of an NDJSON stream: each line is a
// JSON text; a line cut by the stream's end counts unless its JSON is
// whole.
func (r *Reader) feedLines(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			r.feed(p, false)
			return
		}
		r.feed(p[:i], false)
		r.endText(false)
		p = p[i+1:]
	}
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

// feed reads p into r.
func (s *sseLines) feed(r *Reader, p []byte) {
	const field = "data:"
	for i := 0; i < len(p); i++ {
		c := p[i]
		if s.st == sseData && c != '\n' && c != '\r' {
			// The rest of the data line at once.
			j := bytes.IndexAny(p[i:], "\r\n")
			if j < 0 {
				j = len(p) - i
			}
			r.feed(p[i:i+j], false)
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
				s.event(r)
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
						r.scanByte('\n') // data lines join with a newline
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
			r.scanByte(c)
		case sseSkip:
			if eol {
				s.st = sseLineStart
			}
		}
	}
}

// event ends an event: the values its data told are the paths'.
func (s *sseLines) event(r *Reader) {
	if !s.data {
		return
	}
	r.endText(false)
	s.data = false
}
