package simulate

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Options configure a simulation.
type Options struct {
	// Config is the Caddy JSON configuration (adapted already).
	Config []byte
	// ConfigName names it in the report.
	ConfigName string
	// Traffic is a file (an access log or a CSV, gzipped or not), "-" for
	// standard input, or a pattern (see patternHelp).
	Traffic string
	// Stdin is read for Traffic "-" (default os.Stdin).
	Stdin io.Reader
	// Zone is the zone of --compare and of the patterns' defaults.
	Zone string
	// Compare runs the traffic through each algorithm for Zone.
	Compare bool
	// Server and Host: see EngineOptions.Server and the --host flag.
	Server, Host string
	// Series: keep the per-key series of the top keys (a second pass over
	// the traffic, for the HTML report).
	Series bool
	// TopKeys is how many keys to list per zone (default 10).
	TopKeys int
	// TempDir holds standard input spooled for a second pass.
	TempDir string
	// MaxKeys stops the replay when the keys held (the sum of the zones'
	// distinct keys) pass it; 0 for no bound.
	MaxKeys int64
	// Progress shows the replay's progress on this file when it is a
	// terminal (nil: never).
	Progress *os.File
	// KeyOverrides are keys' overrides in force during the replay
	// (--overrides <file>: LoadKeyOverrides).
	KeyOverrides []KeyOverride
}

// Run runs a simulation and returns its report.
func Run(o Options) (*Report, error) {
	if o.TopKeys <= 0 {
		o.TopKeys = 10
	}
	started := time.Now()
	variants := []Overrides{{}}
	probe, err := NewEngine(o.Config, EngineOptions{Server: o.Server})
	if err != nil {
		return nil, err
	}
	zones := probe.Zones()
	sites := probe.Sites()
	host := o.Host
	if host == "" {
		host = probe.DefaultHost()
	}
	rw := probe.rw
	probe.Close()
	zone, err := pickZone(o, zones)
	if err != nil {
		return nil, err
	}
	if o.Compare {
		variants = nil
		for a := range algorithms.SlidingLog + 1 {
			variants = append(variants, Overrides{Zone: zone.Name, Algorithm: a.String()})
		}
	}
	tr, err := openTraffic(o, zones, zone, host)
	if err != nil {
		return nil, err
	}
	defer tr.cleanup()

	rep := &Report{Config: o.ConfigName, Traffic: o.Traffic, Source: tr.kind}
	res, err := pass(o, tr, variants, nil, 0)
	if err != nil {
		return nil, err
	}
	recs, counts, skippedVariants := res.recs, res.counts, res.skipped
	replayTime := counts.replay
	if o.Series && counts.Requests > 0 {
		more, err := seriesPass(o, tr, variants, res)
		if err != nil {
			return nil, err
		}
		replayTime += more
	}
	rep.Counts = counts
	rep.Stopped = res.stopped
	rep.Notes = append(rep.Notes, res.notes(o, counts, sites, host, tr)...)
	rep.Notes = append(rep.Notes, notes(rw, zones, tr.kind, tr.placement)...)
	for _, v := range skippedVariants {
		rep.Notes = append(rep.Notes, v)
	}
	rep.addZones(o, recs, zone, variants)
	rep.Elapsed = time.Since(started).Round(time.Millisecond).String()
	if secs := replayTime.Seconds(); secs > 0 {
		rep.LinesPerSecond = int64(float64(max(counts.Lines, counts.Requests)) * float64(1+btoi(o.Series)) / secs)
	}
	return rep, nil
}

// pickZone is the zone the run is about: --zone, else the config's first
// (--compare needs one zone, a rate zone).
func pickZone(o Options, zones []*ZoneConfig) (*ZoneConfig, error) {
	var zone *ZoneConfig
	if o.Zone != "" {
		for _, z := range zones {
			if z.Name == o.Zone {
				zone = z
			}
		}
		if zone == nil {
			return nil, fmt.Errorf("--zone %q: no such zone (zones: %s)", o.Zone, zoneList(zones))
		}
	} else if o.Compare {
		if len(zones) > 1 {
			return nil, fmt.Errorf("--compare needs --zone: the config has several zones (%s)", zoneList(zones))
		}
		zone = zones[0]
	} else {
		zone = zones[0]
	}
	if o.Compare && zone.Concurrent > 0 {
		return nil, fmt.Errorf("--compare: zone %q is a concurrency zone (concurrent): it has no rate algorithm to compare; choose a rate zone with --zone", zone.Name)
	}
	return zone, nil
}

// seriesPass replays the traffic again, tracking the top keys the first
// pass (res) found, and merges what it records into res's recorders; it
// returns the time its replay took.
func seriesPass(o Options, tr *traffic, variants []Overrides, res *passResult) (time.Duration, error) {
	recs := res.recs
	track := make([]recorderOptions, len(recs))
	for i, rc := range recs {
		if rc == nil {
			continue
		}
		track[i] = recorderOptions{origin: rc.origin, width: rc.width, track: map[string][]algorithms.Key{}}
		for _, zs := range rc.order {
			track[i].track[zs.cfg.Name] = zs.topKeys(seriesKeys)
		}
	}
	res2, err := pass(o, tr, variants, track, res.served)
	if err != nil {
		return 0, err
	}
	for i := range recs {
		if recs[i] != nil {
			recs[i].merge(res2.recs[i])
		}
	}
	return res2.counts.replay, nil
}

// addZones fills in the report's span and its zones from the recorders:
// each algorithm's run of zone with --compare, else every zone.
func (rep *Report) addZones(o Options, recs []*recorder, zone *ZoneConfig, variants []Overrides) {
	first := recs[0]
	for _, rc := range recs {
		if rc != nil {
			first = rc
			break
		}
	}
	if first != nil && first.takes > 0 {
		rep.Start = time.UnixMilli(first.first).UTC().Format(time.RFC3339Nano)
		rep.End = time.UnixMilli(first.last).UTC().Format(time.RFC3339Nano)
		rep.BucketMs = first.width
		rep.OriginMs = first.origin
	}
	if o.Compare {
		rep.Compare = &Comparison{Zone: zone.Name}
		for i, rc := range recs {
			if rc == nil {
				continue
			}
			zr := rc.zoneReport(rc.zones[zone.Name], o.TopKeys, o.Series)
			zr.Algorithm = variants[i].Algorithm
			rep.Compare.Algorithms = append(rep.Compare.Algorithms, zr)
		}
		return
	}
	for _, zs := range first.order {
		rep.Zones = append(rep.Zones, first.zoneReport(zs, o.TopKeys, o.Series))
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// seriesKeys is how many top keys of each zone get a chart.
const seriesKeys = 5

func zoneList(zones []*ZoneConfig) string {
	var names []string
	for _, z := range zones {
		names = append(names, z.Name)
	}
	return strings.Join(names, ", ")
}

// passResult is what one pass over the traffic gives.
type passResult struct {
	recs    []*recorder
	counts  SourceCounts
	skipped []string // --compare variants that could not load
	// served: requests replayed; stopped: why the replay stopped early.
	served  int64
	stopped string
	// undecided: requests no zone decided, a few of their hosts and
	// paths.
	undecided              int64
	triedHosts, triedPaths []string
}

// pass replays the traffic once through one engine per variant; limit > 0
// stops it after that many requests (a second pass stops where the first
// did).
func pass(o Options, tr *traffic, variants []Overrides, track []recorderOptions, limit int64) (*passResult, error) {
	engines := make([]*Engine, len(variants))
	res := &passResult{}
	defer func() {
		for _, e := range engines {
			if e != nil {
				e.Close()
			}
		}
	}()
	for i, v := range variants {
		eo := EngineOptions{Server: o.Server, Overrides: v, KeyOverrides: o.KeyOverrides}
		if track != nil {
			eo.rec = track[i]
		}
		e, err := NewEngine(o.Config, eo)
		if err != nil {
			if len(variants) > 1 {
				// An algorithm the zone's limit cannot take (sliding_log
				// above 10,000 events, gcra's unit): say so, compare the rest.
				res.skipped = append(res.skipped, fmt.Sprintf("--compare: %s skipped: %v", v.Algorithm, err))
				continue
			}
			return nil, err
		}
		engines[i] = e
	}
	tr.read.Store(0)
	src, closer, err := tr.open()
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	if s, ok := src.(interface{ stop() }); ok {
		defer s.stop()
	}
	prog := newProgress(o.Progress, &tr.read, tr.size)
	var req Request
	replayStart := time.Now()
	for res.stopped == "" && (limit == 0 || res.served < limit) && src.Next(&req) {
		if o.Host != "" {
			req.Host = o.Host
		}
		res.served++
		for _, e := range engines {
			if e == nil {
				continue
			}
			e.Serve(&req)
			if o.MaxKeys > 0 && e.run.rec.keys > o.MaxKeys && limit == 0 {
				res.stopped = fmt.Sprintf("the keys held passed --max-keys %d at request %d (%s): the report covers the traffic up to there",
					o.MaxKeys, res.served, time.UnixMilli(req.Time).UTC().Format(time.RFC3339Nano))
			}
		}
		if prog != nil && res.served%1024 == 0 {
			c := src.Counts()
			prog.update(max(c.Lines, c.Requests))
		}
	}
	prog.done()
	if err := src.Err(); err != nil {
		return nil, fmt.Errorf("reading the traffic: %w", err)
	}
	counts := src.Counts()
	counts.replay = time.Since(replayStart)
	res.recs = make([]*recorder, len(engines))
	counted := false
	for i, e := range engines {
		if e != nil {
			res.recs[i] = e.run.rec
			if !counted {
				// A request that cannot be built (a malformed URI) is
				// malformed once, whatever the number of engines; so are
				// the late and the undecided.
				counts.Malformed += e.bad
				counts.Requests -= e.bad
				counts.OutOfOrder = e.late
				res.undecided, res.triedHosts, res.triedPaths = e.undecided, e.triedHosts, e.triedPaths
				counted = true
			}
		}
	}
	res.counts = counts
	return res, nil
}

// merge takes the per-key series of a second pass.
func (rc *recorder) merge(o *recorder) {
	for name, zs := range rc.zones {
		if oz := o.zones[name]; oz != nil {
			zs.tracked = oz.tracked
			zs.series = oz.series // the same counts, in the final buckets
		}
	}
}

// traffic opens a --traffic value, once per pass.
type traffic struct {
	kind      string // "access log", "csv" or "pattern"
	open      func() (Source, io.Closer, error)
	placement *placement
	cleanup   func()
	// read counts the bytes read of a file (or standard input) of size
	// bytes (0: unknown), for the progress.
	read atomic.Int64
	size int64
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

func openTraffic(o Options, zones []*ZoneConfig, zone *ZoneConfig, host string) (*traffic, error) {
	pl := newPlacement(zones)
	tr := &traffic{placement: pl, cleanup: func() {}}
	if _, err := os.Stat(o.Traffic); err != nil && o.Traffic != "-" && isPattern(o.Traffic) {
		p, err := parsePattern(o.Traffic, zone, host)
		if err != nil {
			return nil, err
		}
		tr.kind = "pattern"
		tr.open = func() (Source, io.Closer, error) { return newPatternSource(p, pl), nopCloser{}, nil }
		return tr, nil
	}
	path := o.Traffic
	if path == "-" {
		in := o.Stdin
		if in == nil {
			in = os.Stdin
		}
		if !o.Series {
			kind, src, err := detect(countingReader{in, &tr.read}, pl, host)
			if err != nil {
				return nil, err
			}
			tr.kind = kind
			used := false
			tr.open = func() (Source, io.Closer, error) {
				if used {
					return nil, nil, errors.New("standard input read twice")
				}
				used = true
				return src, nopCloser{}, nil
			}
			return tr, nil
		}
		// Two passes: spool standard input to a file (streamed, never held
		// in memory).
		f, err := os.CreateTemp(o.TempDir, "sluice-simulate-*")
		if err != nil {
			return nil, err
		}
		tr.cleanup = func() { f.Close(); os.Remove(f.Name()) }
		if _, err := io.Copy(f, in); err != nil {
			tr.cleanup()
			return nil, fmt.Errorf("spooling standard input: %w", err)
		}
		path = f.Name()
	}
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("--traffic %q: not a file (%v) nor a pattern (%s)", path, err, strings.Join(patternNames, ", "))
	} else if fi.Mode().IsRegular() {
		tr.size = fi.Size()
	}
	open := func() (Source, io.Closer, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, nil, err
		}
		kind, src, err := detect(countingReader{f, &tr.read}, pl, host)
		if err != nil {
			f.Close()
			return nil, nil, err
		}
		tr.kind = kind
		return src, f, nil
	}
	// Open once to learn the kind (and fail early).
	src, c, err := open()
	if err != nil {
		tr.cleanup()
		return nil, err
	}
	if s, ok := src.(interface{ stop() }); ok {
		s.stop()
	}
	c.Close()
	tr.open = open
	return tr, nil
}

// detect chooses the source by the first bytes: gzip is unpacked, a line
// starting with '{' is an access log, anything else a CSV.
func detect(r io.Reader, pl *placement, host string) (string, Source, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	if b, err := br.Peek(2); err == nil && b[0] == 0x1f && b[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return "", nil, fmt.Errorf("gzip: %w", err)
		}
		br = bufio.NewReaderSize(zr, 1<<20)
	}
	// An access log if a line of the first 64 KB is a JSON object (a
	// garbled first line does not make it a CSV), else a CSV.
	head, _ := br.Peek(64 << 10)
	for _, line := range bytes.Split(head, []byte("\n")) {
		if line = bytes.TrimSpace(line); len(line) > 0 && line[0] == '{' {
			return "access log", newAccessLog(br), nil
		}
	}
	if len(bytes.TrimSpace(head)) == 0 {
		return "access log", newAccessLog(br), nil // empty: no lines
	}
	return "csv", newCSV(br, pl, host), nil
}

// sortedRetry returns the Retry-After values seen, in order.
func sortedRetry(m map[int64]int64) []int64 {
	ks := make([]int64, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

// Requests returns the requests of a --traffic value as the simulator
// replays them (an access log's lines at their start, a CSV's keys and
// costs placed for the config's zones), with the source's counts: for
// tests and tools that send the same traffic to a real server.
func Requests(o Options) ([]Request, SourceCounts, error) {
	e, err := NewEngine(o.Config, EngineOptions{Server: o.Server})
	if err != nil {
		return nil, SourceCounts{}, err
	}
	zones := e.Zones()
	host := o.Host
	if host == "" {
		host = e.DefaultHost()
	}
	e.Close()
	zone := zones[0]
	for _, z := range zones {
		if z.Name == o.Zone {
			zone = z
		}
	}
	tr, err := openTraffic(o, zones, zone, host)
	if err != nil {
		return nil, SourceCounts{}, err
	}
	defer tr.cleanup()
	src, c, err := tr.open()
	if err != nil {
		return nil, SourceCounts{}, err
	}
	defer c.Close()
	if s, ok := src.(interface{ stop() }); ok {
		defer s.stop()
	}
	var out []Request
	var r Request
	for src.Next(&r) {
		if o.Host != "" {
			r.Host = o.Host
		}
		out = append(out, r)
	}
	return out, src.Counts(), src.Err()
}
