package simulate

import (
	"slices"
	"sort"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// maxBuckets bounds a time series: past it, buckets are merged in pairs
// (their width doubles), so a series stays this small whatever the span.
const maxBuckets = 720

// series counts allowed and refused decisions per bucket of time.
type series struct {
	allowed, refused []int64
}

func (s *series) add(i int, refused bool) {
	for len(s.allowed) <= i {
		s.allowed = append(s.allowed, 0)
		s.refused = append(s.refused, 0)
	}
	if refused {
		s.refused[i]++
	} else {
		s.allowed[i]++
	}
}

// fold merges pairs of buckets (the width doubles).
func (s *series) fold() {
	n := (len(s.allowed) + 1) / 2
	for i := range n {
		a, r := s.allowed[2*i], s.refused[2*i]
		if 2*i+1 < len(s.allowed) {
			a += s.allowed[2*i+1]
			r += s.refused[2*i+1]
		}
		s.allowed[i], s.refused[i] = a, r
	}
	s.allowed, s.refused = s.allowed[:n], s.refused[:n]
}

// zoneStats is what the recorder keeps of one zone.
type zoneStats struct {
	cfg                                          *ZoneConfig
	decided, allowed, refused, vetoed, wouldDeny int64
	// keys holds every key decided, with its refusals (would-be refusals
	// in a report-only zone): memory grows with the keys, never the lines.
	keys map[algorithms.Key]int64
	// retry counts refusals by Retry-After in whole seconds (rounded up,
	// as the header is sent).
	retry map[int64]int64
	// the busiest second of refusals
	sec, secN, peak, peakAt int64
	series                  series
	// tracked holds the series of the keys chosen for the HTML report
	// (second pass only).
	tracked map[algorithms.Key]*series
}

// recorderOptions configure what a recorder keeps beyond the counts.
type recorderOptions struct {
	// origin and width fix the series' buckets (second pass); zero
	// width starts at one second and doubles as needed.
	origin, width int64
	// track lists, per zone, the keys whose series to keep.
	track map[string][]algorithms.Key
}

// recorder receives every decision of a simulation.
type recorder struct {
	zones         map[string]*zoneStats
	order         []*zoneStats
	origin, width int64
	fixed         bool
	started       bool
	first, last   int64
	takes         int64
	// keys counts the keys held in every zone's keys (a key of two zones
	// twice): what the recorder's memory grows with.
	keys int64
}

func newRecorder(zones []*ZoneConfig, o recorderOptions) *recorder {
	rc := &recorder{zones: map[string]*zoneStats{}, origin: o.origin, width: o.width}
	if rc.width > 0 {
		rc.fixed, rc.started = true, true
	} else {
		rc.width = 1000
	}
	for _, z := range zones {
		zs := &zoneStats{cfg: z, keys: map[algorithms.Key]int64{}, retry: map[int64]int64{}, sec: -1}
		if keys := o.track[z.Name]; len(keys) > 0 {
			zs.tracked = map[algorithms.Key]*series{}
			for _, k := range keys {
				zs.tracked[k] = &series{}
			}
		}
		rc.zones[z.Name] = zs
		rc.order = append(rc.order, zs)
	}
	return rc
}

// record counts one store call: every zone of one request, decided
// together (a refusal by an enforcing zone vetoes the others, as in the
// handler's metrics).
func (rc *recorder) record(now int64, reqs []algorithms.Request, out []algorithms.Decision) {
	if !rc.started {
		rc.started, rc.origin, rc.first = true, now, now
	}
	if rc.takes == 0 {
		rc.first = now
	}
	rc.takes++
	rc.last = now
	refused := false
	for i := range reqs {
		if !out[i].Allowed && !reqs[i].ReportOnly {
			refused = true
		}
	}
	idx := rc.bucket(now)
	for i := range reqs {
		zs := rc.zones[reqs[i].Zone]
		if zs == nil {
			continue
		}
		zs.decided++
		deny := !out[i].Allowed
		switch {
		case deny && reqs[i].ReportOnly:
			zs.wouldDeny++
		case !refused:
			zs.allowed++
		case deny:
			zs.refused++
		default:
			zs.vetoed++
		}
		k := reqs[i].Key
		if _, ok := zs.keys[k]; !ok {
			rc.keys++
		}
		if deny {
			zs.keys[k]++
			secs := (out[i].RetryAfter.Milliseconds() + 999) / 1000
			zs.retry[secs]++
			if s := now / 1000; s != zs.sec {
				zs.sec, zs.secN = s, 0
			}
			zs.secN++
			if zs.secN > zs.peak {
				zs.peak, zs.peakAt = zs.secN, zs.sec*1000
			}
		} else if _, ok := zs.keys[k]; !ok {
			zs.keys[k] = 0
		}
		// A request refused by another zone is shown as refused: it did not
		// pass.
		shown := deny || refused
		if idx >= 0 {
			zs.series.add(idx, shown)
			if zs.tracked != nil {
				if ts := zs.tracked[k]; ts != nil {
					ts.add(idx, shown)
				}
			}
		}
	}
}

// bucket returns the series bucket of instant now, folding every series
// when it would pass maxBuckets; -1 outside a fixed range.
func (rc *recorder) bucket(now int64) int {
	d := now - rc.origin
	if d < 0 {
		return -1
	}
	i := d / rc.width
	if rc.fixed {
		if i >= maxBuckets {
			return -1
		}
		return int(i)
	}
	for i >= maxBuckets {
		rc.width *= 2
		i = d / rc.width
		for _, zs := range rc.order {
			zs.series.fold()
		}
	}
	return int(i)
}

// topKeys returns the n keys with the most refusals, most first (ties by
// token, for a stable report).
func (zs *zoneStats) topKeys(n int) []algorithms.Key {
	var ks []algorithms.Key
	for k, c := range zs.keys {
		if c > 0 {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool {
		ci, cj := zs.keys[ks[i]], zs.keys[ks[j]]
		if ci != cj {
			return ci > cj
		}
		return slices.Compare(ks[i][:], ks[j][:]) < 0
	})
	if len(ks) > n {
		ks = ks[:n]
	}
	return ks
}
