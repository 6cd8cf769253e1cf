package simulate

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Patterns are built-in traffic for teaching and tuning. A pattern is named
// with its parameters: `steady`, `burst:size=50,every=30s`,
// `window-edge:window=1m,events=100`. See patternHelp.
var patternNames = []string{"steady", "burst", "window-edge", "ramp", "sawtooth"}

const patternHelp = `Built-in traffic patterns (--traffic NAME[:param=value,...]):
  steady       rate requests a second, evenly spaced, for duration
  burst        size requests within spread, every interval, over duration,
               on top of a steady rate (default 0)
  window-edge  events requests in the spread just before a window boundary,
               then events more just after it: a fixed window admits both
               halves (twice its limit in one spread); every other
               algorithm admits about the limit once
  ramp         the rate grows linearly from "from" to "to" over duration
  sawtooth     the rate climbs from "from" to "to" over each period, then
               drops back, for duration
Parameters (all optional):
  rate=10 duration=1m                          steady (rate also under burst)
  size=100 every=1m spread=1s duration=5m      burst
  events=<zone's> window=<zone's> spread=<window/100> times=1   window-edge
  from=1 to=100 duration=1m                    ramp, sawtooth
  period=10s                                   sawtooth
  keys=1        clients, taking turns (addresses in 198.18.0.0/15)
  key=<prefix>  clients named <prefix>1.. instead of addresses (placed as a
                CSV key that is not an address is)
  path=/ method=GET host=<the site's> cost=<none>
  start=2026-01-01T00:00:00Z   the first instant (RFC 3339)
The zone defaults (events, window) come from --zone, or the first zone.
Ranges: rate, from, to 0..1000000; size 0..50000000; events, times, keys
1..50000000; durations 1ms..744h; at most 50000000 requests in all.`

// isPattern reports whether a --traffic value names a pattern.
func isPattern(spec string) bool {
	name, _, _ := strings.Cut(spec, ":")
	return slices.Contains(patternNames, name)
}

// pattern is a parsed pattern: its requests are generated in time order.
type pattern struct {
	name   string
	params map[string]string
	used   map[string]bool

	// resolved parameters
	start, duration      int64 // ms
	rate, from, to       float64
	size, times          int64
	every, spread        int64
	period, window       int64
	events               int64
	keys                 int64
	keyPrefix            string
	path, method, host   string
	cost                 string
	zoneEvents, zoneWinM int64
}

// Bounds of a pattern: its requests, and each parameter, checked before
// any arithmetic (docs/simulate.md, "Bounds").
const (
	maxPatternRequests = 50_000_000
	maxPatternRate     = 1_000_000           // rate, from, to: requests a second
	maxPatternDuration = 31 * 24 * time.Hour // duration, every, spread, period, window
	minPatternDuration = time.Millisecond    // the virtual clock's unit
	maxPatternCount    = maxPatternRequests  // size, events, times, keys
)

// parsePattern parses NAME[:k=v,...]; zone gives the defaults of
// window-edge.
func parsePattern(spec string, zone *ZoneConfig, host string) (*pattern, error) {
	name, rest, _ := strings.Cut(spec, ":")
	params, err := splitParams(name, rest)
	if err != nil {
		return nil, err
	}
	p := &pattern{name: name, params: params, used: map[string]bool{}, host: host}
	if zone != nil {
		p.zoneEvents, p.zoneWinM = zone.Events, zone.WindowMs
	}
	r := &paramReader{p: p}
	if err := r.common(); err != nil {
		return nil, err
	}
	if err := r.shape(); err != nil {
		return nil, err
	}
	for k := range p.params {
		if !p.used[k] {
			return nil, fmt.Errorf("pattern %s: unknown parameter %q\n%s", name, k, patternHelp)
		}
	}
	if n := p.estimate(); n > maxPatternRequests {
		return nil, fmt.Errorf("pattern %s: about %.0f requests, more than %d: lower the rate or the duration", name, n, maxPatternRequests)
	}
	return p, nil
}

// splitParams reads a pattern's k=v,... list.
func splitParams(name, rest string) (map[string]string, error) {
	params := map[string]string{}
	if rest == "" {
		return params, nil
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("pattern %s: parameter %q is not name=value", name, kv)
		}
		if _, twice := params[k]; twice {
			return nil, fmt.Errorf("pattern %s: parameter %s is given twice", name, k)
		}
		params[k] = strings.TrimSpace(v)
	}
	return params, nil
}

// paramReader reads a pattern's parameters, each marked used once read,
// keeping the first error: a reader with an error reads zeros.
type paramReader struct {
	p   *pattern
	err error
}

func (r *paramReader) get(k string) (string, bool) {
	v, ok := r.p.params[k]
	r.p.used[k] = true
	return v, ok
}

// dur reads a duration in milliseconds, within the bounds.
func (r *paramReader) dur(k string, def time.Duration) int64 {
	if r.err != nil {
		return 0
	}
	v, ok := r.get(k)
	if !ok {
		return def.Milliseconds()
	}
	d, e := time.ParseDuration(v)
	if e != nil || d <= 0 {
		r.err = fmt.Errorf("pattern %s: %s=%q is not a positive duration (such as 30s, 1m)", r.p.name, k, v)
		return 0
	}
	if d < minPatternDuration || d > maxPatternDuration {
		r.err = fmt.Errorf("pattern %s: %s=%s is out of range (%s to %s)", r.p.name, k, v, minPatternDuration, maxPatternDuration)
		return 0
	}
	return d.Milliseconds()
}

// num reads a number within [lo, hi]; whole says it counts things.
func (r *paramReader) num(k string, def, lo, hi float64, whole bool) float64 {
	if r.err != nil {
		return 0
	}
	v, ok := r.get(k)
	if !ok {
		return def
	}
	name := r.p.name
	f, e := strconv.ParseFloat(v, 64)
	switch {
	case e != nil || math.IsNaN(f) || math.IsInf(f, 0):
		r.err = fmt.Errorf("pattern %s: %s=%q is not a number", name, k, v)
	case f < lo || f > hi:
		r.err = fmt.Errorf("pattern %s: %s=%s is out of range (%s to %s)", name, k, v,
			strconv.FormatFloat(lo, 'f', -1, 64), strconv.FormatFloat(hi, 'f', -1, 64))
	case whole && f != math.Trunc(f):
		r.err = fmt.Errorf("pattern %s: %s=%s is not a whole number", name, k, v)
	}
	if r.err != nil {
		return 0
	}
	return f
}

func (r *paramReader) count(k string, def, lo float64) int64 {
	return int64(r.num(k, def, lo, maxPatternCount, true))
}

func (r *paramReader) rate(k string, def float64) float64 {
	return r.num(k, def, 0, maxPatternRate, false)
}

// common reads the parameters every pattern has: start, keys, key, path,
// method, host and cost.
func (r *paramReader) common() error {
	p, name := r.p, r.p.name
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if v, ok := r.get("start"); ok {
		t, e := time.Parse(time.RFC3339Nano, v)
		if e != nil {
			return fmt.Errorf("pattern %s: start=%q is not an RFC 3339 time", name, v)
		}
		if t.Year() < 1970 {
			return fmt.Errorf("pattern %s: start=%s is out of range (1970 or later)", name, v)
		}
		start = t
	}
	p.start = start.UnixMilli()
	p.keys = r.count("keys", 1, 1)
	if r.err != nil {
		return r.err
	}
	if v, ok := r.get("key"); ok {
		p.keyPrefix = v
	}
	p.path, _ = r.get("path")
	if p.path == "" {
		p.path = "/"
	}
	if !strings.HasPrefix(p.path, "/") {
		return fmt.Errorf("pattern %s: path=%q must start with /", name, p.path)
	}
	p.method, _ = r.get("method")
	if v, ok := r.get("host"); ok {
		p.host = v
	}
	if v, ok := r.get("cost"); ok {
		if n, e := strconv.ParseInt(v, 10, 64); e != nil || n < 1 {
			return fmt.Errorf("pattern %s: cost=%q is not a positive integer", name, v)
		}
		p.cost = v
	}
	return nil
}

// shape reads the parameters of the pattern's own shape (rate, burst,
// window edge, ramp).
func (r *paramReader) shape() error {
	p := r.p
	switch p.name {
	case "steady":
		p.rate = r.rate("rate", 10)
		p.duration = r.dur("duration", time.Minute)
	case "burst":
		p.rate = r.rate("rate", 0)
		p.size = r.count("size", 100, 0)
		p.every = r.dur("every", time.Minute)
		p.spread = r.dur("spread", time.Second)
		p.duration = r.dur("duration", 5*time.Minute)
	case "window-edge":
		p.events = r.count("events", float64(max(min(p.zoneEvents, maxPatternCount), 1)), 1)
		win := time.Duration(max(p.zoneWinM, 1000)) * time.Millisecond
		p.window = r.dur("window", win)
		p.spread = r.dur("spread", max(time.Millisecond, time.Duration(p.window)*time.Millisecond/100))
		p.times = r.count("times", 1, 1)
		if r.err == nil && p.spread > p.window {
			return fmt.Errorf("pattern window-edge: spread must not exceed the window")
		}
	case "ramp", "sawtooth":
		p.from = r.rate("from", 1)
		p.to = r.rate("to", 100)
		p.duration = r.dur("duration", time.Minute)
		if p.name == "sawtooth" {
			p.period = r.dur("period", 10*time.Second)
		}
	default:
		return fmt.Errorf("unknown pattern %q (known: %s)", p.name, strings.Join(patternNames, ", "))
	}
	return r.err
}

// estimate is about how many requests the pattern makes (in floating
// point: it cannot overflow).
func (p *pattern) estimate() float64 {
	secs := float64(p.duration) / 1000
	switch p.name {
	case "steady":
		return p.rate * secs
	case "burst":
		return p.rate*secs + float64(p.size)*float64(p.duration/p.every+1)
	case "window-edge":
		return 2 * float64(p.events) * float64(p.times)
	}
	return max(p.from, p.to) * secs
}

// patternSource generates a pattern's requests.
type patternSource struct {
	p      *pattern
	pl     *placement
	counts SourceCounts
	n      int64 // requests made
	// rate patterns: the current millisecond and the fractional carry
	t     int64
	carry float64
	due   int64 // requests still to make at t
	// burst / window-edge: the instants, computed lazily
	times []int64
	ti    int
}

func newPatternSource(p *pattern, pl *placement) *patternSource {
	s := &patternSource{p: p, pl: pl, t: -1}
	if _, ok := p.params["host"]; !ok {
		pl.hostDefaulted = true
	}
	switch p.name {
	case "burst":
		// Bursts at 0, every, 2·every...; the steady part is merged in.
		for b := int64(0); b < p.duration; b += p.every {
			for i := range p.size {
				s.times = append(s.times, b+i*p.spread/max(p.size, 1))
			}
		}
		if p.rate > 0 {
			step := 1000 / p.rate
			for t := 0.0; t < float64(p.duration); t += step {
				s.times = append(s.times, int64(t))
			}
		}
		slices.Sort(s.times)
	case "window-edge":
		// Each edge: the first window boundary after the start (plus one
		// spread), then every other window after.
		w := p.window
		b := (p.start + p.spread + w - 1) / w * w
		for range p.times {
			for i := range p.events {
				s.times = append(s.times, b-p.spread+i*p.spread/max(p.events, 1)-p.start)
			}
			for i := range p.events {
				s.times = append(s.times, b+i*p.spread/max(p.events, 1)-p.start)
			}
			b += 2 * w
		}
	}
	return s
}

func (s *patternSource) Err() error           { return nil }
func (s *patternSource) Counts() SourceCounts { return s.counts }

// rateAt is the rate (requests a second) of a rate pattern at offset t ms.
func (s *patternSource) rateAt(t int64) float64 {
	p := s.p
	switch p.name {
	case "steady":
		return p.rate
	case "ramp":
		return p.from + (p.to-p.from)*float64(t)/float64(p.duration)
	case "sawtooth":
		return p.from + (p.to-p.from)*float64(t%p.period)/float64(p.period)
	}
	return 0
}

// next returns the offset of the next request, or false at the end.
func (s *patternSource) next() (int64, bool) {
	if s.p.name == "burst" || s.p.name == "window-edge" {
		if s.ti >= len(s.times) {
			return 0, false
		}
		s.ti++
		return s.times[s.ti-1], true
	}
	for s.due == 0 {
		s.t++
		if s.t >= s.p.duration {
			return 0, false
		}
		// The rate's integral over this millisecond, with the carry, says
		// how many requests arrive in it; the first arrives at t = 0.
		s.carry += s.rateAt(s.t) / 1000
		if s.t == 0 && s.carry < 1 {
			s.carry = 1
		}
		if s.carry >= 1 {
			s.due = int64(s.carry)
			s.carry -= float64(s.due)
		}
	}
	s.due--
	return s.t, true
}

func (s *patternSource) Next(req *Request) bool {
	off, ok := s.next()
	if !ok {
		return false
	}
	p := s.p
	*req = Request{Time: p.start + off, Method: p.method, URI: p.path, Host: p.host}
	k := s.n % p.keys
	s.n++
	var key string
	if p.keyPrefix != "" {
		key = p.keyPrefix + strconv.FormatInt(k+1, 10)
	} else {
		key = benchAddr(k).String()
	}
	s.pl.apply(req, key, p.cost)
	s.counts.Requests++
	return true
}

// benchAddr is the i-th address of 198.18.0.0/15 (RFC 2544's benchmarking
// range), from 198.18.0.1.
func benchAddr(i int64) netip.Addr {
	n := uint32(198)<<24 | uint32(18)<<16 + uint32(i%(1<<17-2)) + 1
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}
