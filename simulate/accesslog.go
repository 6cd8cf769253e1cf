package simulate

import (
	"bytes"
	"container/heap"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"
)

// Source yields the requests of some traffic in time order.
type Source interface {
	// Next fills req with the next request and reports false at the end.
	Next(req *Request) bool
	// Err is the error that ended the traffic early, if any.
	Err() error
	// Counts reports what the source read so far.
	Counts() SourceCounts
}

// SourceCounts is what a source read.
type SourceCounts struct {
	// Lines read (an access log or a CSV; 0 for a pattern).
	Lines int64 `json:"lines"`
	// Requests yielded.
	Requests int64 `json:"requests"`
	// Malformed lines, counted and skipped.
	Malformed int64 `json:"malformed"`
	// Skipped lines that are well formed but not requests (other loggers
	// of Caddy's log, a CSV header).
	Skipped int64 `json:"skipped"`
	// OutOfOrder counts requests earlier than one replayed before them:
	// each is replayed at the latest instant so far.
	OutOfOrder int64 `json:"out_of_order"`

	replay time.Duration // the time the replay took (not loading)
}

// reorderWindow is how far back an access log line's request may have
// started before lines already read: Caddy logs a request when it
// completes, so lines are in order of completion; each request is
// replayed at its start (ts minus duration), and requests are reordered
// by start within this window. A request that took longer is replayed
// as soon as it is read (the virtual clock never runs backwards).
const reorderWindow = 5 * 1000 // ms

// accessLog reads Caddy's JSON access log lines (loggers http.log.access
// and http.log.access.*): ts, duration, user_id and request {remote_ip,
// remote_port, proto, method, host, uri, headers, tls}.
type accessLog struct {
	err     error
	counts  SourceCounts
	pending reqHeap
	maxEnd  int64
	eof     bool
	// Lines are read and decoded by another goroutine, in batches, while
	// this one replays: decoding JSON costs about as much as the replay.
	batches chan []parsedLine
	batch   []parsedLine
	bi      int
	quit    chan struct{}
	readErr error // set by the reader before it closes batches
}

type parsedLine struct {
	r      *Request
	end    int64
	status int
}

const logBatch = 256

// newAccessLog reads an access log from r.
func newAccessLog(r io.Reader) *accessLog {
	a := &accessLog{batches: make(chan []parsedLine, 8), quit: make(chan struct{})}
	go a.read(r)
	return a
}

// read decodes lines into batches until the end of r or stop.
func (a *accessLog) read(r io.Reader) {
	defer close(a.batches)
	lr := newLineReader(r, maxLogLine)
	var l logLine
	batch := make([]parsedLine, 0, logBatch)
	for {
		line, tooLong, err := lr.next()
		if err != nil {
			if err != io.EOF {
				a.readErr = err
			}
			break
		}
		p := parsedLine{status: lineMalformed}
		if !tooLong {
			p.r, p.end, p.status = parseLogLine(line, &l)
		}
		batch = append(batch, p)
		if len(batch) == logBatch {
			select {
			case a.batches <- batch:
			case <-a.quit:
				return
			}
			batch = make([]parsedLine, 0, logBatch)
		}
	}
	if len(batch) > 0 {
		select {
		case a.batches <- batch:
		case <-a.quit:
		}
	}
}

// stop ends the reader early (the replay gave up).
func (a *accessLog) stop() {
	select {
	case <-a.quit:
	default:
		close(a.quit)
	}
}

// logLine is the part of an access log line the simulator reads.
type logLine struct {
	Logger   string          `json:"logger"`
	TS       json.RawMessage `json:"ts"`
	Duration json.RawMessage `json:"duration"`
	UserID   string          `json:"user_id"`
	Status   int             `json:"status"`
	// RespHeaders are the response's headers, sent again by the replaced
	// upstream (a settle header zone reads its amount there).
	RespHeaders map[string][]string `json:"resp_headers"`
	Request     *struct {
		RemoteIP   string              `json:"remote_ip"`
		RemotePort string              `json:"remote_port"`
		Proto      string              `json:"proto"`
		Method     string              `json:"method"`
		Host       string              `json:"host"`
		URI        string              `json:"uri"`
		Headers    map[string][]string `json:"headers"`
		TLS        *struct {
			ServerName string `json:"server_name"`
		} `json:"tls"`
	} `json:"request"`
}

func (a *accessLog) Err() error           { return a.err }
func (a *accessLog) Counts() SourceCounts { return a.counts }

func (a *accessLog) Next(req *Request) bool {
	for {
		if n := len(a.pending); n > 0 && (a.eof || a.pending[0].Time <= a.maxEnd-reorderWindow) {
			*req = *heap.Pop(&a.pending).(*Request)
			a.counts.Requests++
			return true
		}
		if a.eof {
			return false
		}
		if a.bi == len(a.batch) {
			b, ok := <-a.batches
			if !ok {
				a.eof = true
				a.err = a.readErr
				continue
			}
			a.batch, a.bi = b, 0
		}
		p := a.batch[a.bi]
		a.bi++
		a.counts.Lines++
		switch p.status {
		case lineMalformed:
			a.counts.Malformed++
			continue
		case lineOther:
			a.counts.Skipped++
			continue
		}
		a.maxEnd = max(a.maxEnd, p.end)
		p.r.seq = a.counts.Lines
		heap.Push(&a.pending, p.r)
	}
}

const (
	lineOK = iota
	lineMalformed
	lineOther
)

// parseLogLine decodes one access log line into a request (replayed at its
// start) and returns the instant it ended. It never panics.
func parseLogLine(b []byte, l *logLine) (*Request, int64, int) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, 0, lineOther
	}
	*l = logLine{}
	if err := json.Unmarshal(b, l); err != nil {
		return nil, 0, lineMalformed
	}
	if l.Logger != "" && l.Logger != "http.log.access" && !strings.HasPrefix(l.Logger, "http.log.access.") {
		return nil, 0, lineOther
	}
	rq := l.Request
	if rq == nil {
		if l.Logger == "" {
			return nil, 0, lineMalformed
		}
		return nil, 0, lineOther
	}
	end, ok := parseTS(l.TS)
	if !ok || rq.URI == "" && rq.Method == "" {
		return nil, 0, lineMalformed
	}
	start := end - parseDurationMs(l.Duration)
	r := &Request{
		Time:   start,
		Method: rq.Method,
		Host:   rq.Host,
		URI:    rq.URI,
		Proto:  rq.Proto,
		UserID: l.UserID,
		Status: l.Status,
	}
	if len(rq.Headers) > 0 {
		r.Header = make(http.Header, len(rq.Headers))
		for k, v := range rq.Headers {
			r.Header[textproto.CanonicalMIMEHeaderKey(k)] = v
		}
	}
	if len(l.RespHeaders) > 0 {
		r.RespHeader = make(http.Header, len(l.RespHeaders))
		for k, v := range l.RespHeaders {
			r.RespHeader[textproto.CanonicalMIMEHeaderKey(k)] = v
		}
	}
	if rq.RemoteIP != "" {
		port := rq.RemotePort
		if port == "" {
			port = "0"
		}
		r.RemoteAddr = net.JoinHostPort(rq.RemoteIP, port)
	}
	if rq.TLS != nil {
		r.TLS, r.ServerName = true, rq.TLS.ServerName
	}
	return r, end, lineOK
}

// parseTS reads a log timestamp: a number of seconds since the Unix epoch
// (Caddy's default; milliseconds or nanoseconds when the number is that
// large), or a string in RFC 3339, ISO 8601 or Caddy's wall formats. It
// returns Unix milliseconds.
func parseTS(raw json.RawMessage) (int64, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, false
		}
		return parseTimeString(s)
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	switch {
	case f >= 1e17: // nanoseconds
		return int64(f / 1e6), true
	case f >= 1e14: // microseconds
		return int64(f / 1e3), true
	case f >= 1e11: // milliseconds
		return int64(f), true
	}
	return int64(math.Round(f * 1000)), true
}

var timeLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02T15:04:05.000Z0700",
	"2006-01-02T15:04:05Z0700",
	"2006/01/02 15:04:05.000",
	"2006/01/02 15:04:05",
	time.RFC1123Z,
	time.RFC1123,
	"2006-01-02 15:04:05.000",
	"2006-01-02 15:04:05",
}

// parseTimeString parses an absolute time; it returns Unix milliseconds.
func parseTimeString(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	for _, layout := range timeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UnixMilli(), true
		}
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) && f >= 0 {
		return parseTS(json.RawMessage(s))
	}
	return 0, false
}

// parseDurationMs reads a logged duration: seconds as a number (Caddy's
// default), nanoseconds for a large integer (duration_format nano), or a
// Go duration string (duration_format string). Unusable values are 0.
func parseDurationMs(raw json.RawMessage) int64 {
	if len(raw) == 0 {
		return 0
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return 0
		}
		return d.Milliseconds()
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0
	}
	if f >= 1e4 && f == math.Trunc(f) {
		return int64(f / 1e6) // nanoseconds
	}
	if f > 86400 {
		return 0 // not a plausible request duration in seconds
	}
	return int64(f * 1000)
}

// reqHeap orders pending requests by start time.
type reqHeap []*Request

func (h reqHeap) Len() int { return len(h) }
func (h reqHeap) Less(i, j int) bool {
	return h[i].Time < h[j].Time || h[i].Time == h[j].Time && h[i].seq < h[j].seq
}
func (h reqHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *reqHeap) Push(x any)   { *h = append(*h, x.(*Request)) }
func (h *reqHeap) Pop() any {
	old := *h
	n := len(old)
	x := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	return x
}
