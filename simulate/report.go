package simulate

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/caddy-sluice/identity"
)

// Report is a simulation's outcome (--format json writes it as it is).
type Report struct {
	Config  string `json:"config"`
	Traffic string `json:"traffic"`
	// Source is the kind of traffic: "access log", "csv" or "pattern".
	Source string       `json:"source"`
	Counts SourceCounts `json:"counts"`
	// Start and End are the first and last decisions' instants.
	Start string `json:"start,omitempty"`
	End   string `json:"end,omitempty"`
	// BucketMs is the width of the series' buckets, from OriginMs (Unix
	// ms).
	BucketMs int64 `json:"bucket_ms,omitempty"`
	OriginMs int64 `json:"origin_ms,omitempty"`
	// Zones: every zone of the config (not with Compare).
	Zones []ZoneReport `json:"zones,omitempty"`
	// Compare: one zone under each algorithm (--compare).
	Compare *Comparison `json:"compare,omitempty"`
	// Stopped says why the replay stopped before the end of the traffic
	// (--max-keys); empty when it read it all.
	Stopped string `json:"stopped,omitempty"`
	// Notes say what the simulation could not reconstruct, and what it
	// replaced in the config.
	Notes []string `json:"notes,omitempty"`
	// Elapsed and LinesPerSecond measure the replay.
	Elapsed        string `json:"elapsed"`
	LinesPerSecond int64  `json:"lines_per_second"`
}

// Comparison is one zone under each algorithm.
type Comparison struct {
	Zone       string       `json:"zone"`
	Algorithms []ZoneReport `json:"algorithms"`
}

// ZoneReport is one zone's outcome.
type ZoneReport struct {
	ZoneConfig
	// Decided counts the requests the zone decided; each is allowed,
	// refused (by this zone), vetoed (allowed by this zone, refused by
	// another zone of the same request: not charged) or, in a report-only
	// zone, would-refuse (what enforcing it would refuse).
	Decided     int64 `json:"decided"`
	Allowed     int64 `json:"allowed"`
	Refused     int64 `json:"refused"`
	Vetoed      int64 `json:"vetoed"`
	WouldRefuse int64 `json:"would_refuse"`
	// Keys counts the distinct keys decided.
	Keys int64 `json:"keys"`
	// TopKeys are the keys refused most (tokens, never raw keys).
	TopKeys []KeyReport `json:"top_keys"`
	// PeakRefusedPerSecond is the most refusals (or would-be refusals)
	// within one second, starting at PeakAt.
	PeakRefusedPerSecond int64  `json:"peak_refused_per_second"`
	PeakAt               string `json:"peak_at,omitempty"`
	// RetryAfter is the distribution of Retry-After (whole seconds, as
	// sent) over the refusals.
	RetryAfter RetryDist `json:"retry_after"`
	// Series: allowed and refused per bucket (refused includes refused by
	// another zone and would-refuse).
	Series Series `json:"series"`
}

// KeyReport is one key's refusals.
type KeyReport struct {
	Token   string  `json:"token"`
	Refused int64   `json:"refused"`
	Series  *Series `json:"series,omitempty"`
}

// Series counts per bucket.
type Series struct {
	Allowed []int64 `json:"allowed"`
	Refused []int64 `json:"refused"`
}

// RetryDist summarises Retry-After values in seconds.
type RetryDist struct {
	Count   int64         `json:"count"`
	P50     int64         `json:"p50"`
	P90     int64         `json:"p90"`
	P99     int64         `json:"p99"`
	Max     int64         `json:"max"`
	Buckets []RetryBucket `json:"buckets"`
}

// RetryBucket counts Retry-After values up to Le seconds ("+Inf" last).
type RetryBucket struct {
	Le    string `json:"le"`
	Count int64  `json:"count"`
}

var retryBounds = []int64{1, 2, 5, 10, 30, 60, 300, 900, 3600}

func (rc *recorder) zoneReport(zs *zoneStats, top int, withSeries bool) ZoneReport {
	zr := ZoneReport{
		ZoneConfig: *zs.cfg,
		Decided:    zs.decided, Allowed: zs.allowed, Refused: zs.refused, Vetoed: zs.vetoed, WouldRefuse: zs.wouldDeny,
		Keys:                 int64(len(zs.keys)),
		PeakRefusedPerSecond: zs.peak,
		TopKeys:              []KeyReport{},
		Series:               Series{Allowed: nonNil(zs.series.allowed), Refused: nonNil(zs.series.refused)},
	}
	if zs.peak > 0 {
		zr.PeakAt = time.UnixMilli(zs.peakAt).UTC().Format(time.RFC3339)
	}
	for _, k := range zs.topKeys(top) {
		kr := KeyReport{Token: identity.Token(k).String(), Refused: zs.keys[k]}
		if withSeries && zs.tracked != nil {
			if s := zs.tracked[k]; s != nil {
				kr.Series = &Series{Allowed: nonNil(s.allowed), Refused: nonNil(s.refused)}
			}
		}
		zr.TopKeys = append(zr.TopKeys, kr)
	}
	// Every series of the report has the run's bucket count: a zone (or a
	// key) quiet at the end still spans the whole time axis.
	n := len(zr.Series.Allowed)
	if rc.takes > 0 {
		n = max(n, min(int((rc.last-rc.origin)/rc.width)+1, maxBuckets))
	}
	zr.Series.Allowed, zr.Series.Refused = pad(zr.Series.Allowed, n), pad(zr.Series.Refused, n)
	for i := range zr.TopKeys {
		if s := zr.TopKeys[i].Series; s != nil {
			// Every series of the report has the zone's bucket count.
			s.Allowed, s.Refused = pad(s.Allowed, n), pad(s.Refused, n)
		}
	}
	zr.RetryAfter = retryDist(zs.retry)
	return zr
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return slices.Clone(s)
}

func pad(s []int64, n int) []int64 {
	for len(s) < n {
		s = append(s, 0)
	}
	return s
}

func retryDist(m map[int64]int64) RetryDist {
	var d RetryDist
	ks := sortedRetry(m)
	for _, k := range ks {
		d.Count += m[k]
	}
	if d.Count == 0 {
		d.Buckets = []RetryBucket{}
		return d
	}
	pct := func(p float64) int64 {
		want := int64(float64(d.Count)*p + 0.9999999)
		var c int64
		for _, k := range ks {
			c += m[k]
			if c >= want {
				return k
			}
		}
		return ks[len(ks)-1]
	}
	d.P50, d.P90, d.P99, d.Max = pct(0.5), pct(0.9), pct(0.99), ks[len(ks)-1]
	for _, b := range retryBounds {
		var c int64
		for _, k := range ks {
			if k <= b {
				c += m[k]
			}
		}
		d.Buckets = append(d.Buckets, RetryBucket{Le: strconv.FormatInt(b, 10), Count: c})
	}
	d.Buckets = append(d.Buckets, RetryBucket{Le: "+Inf", Count: d.Count})
	return d
}

// WriteJSON writes the report as JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// describe renders a zone's limit as the Caddyfile writes it.
func (z *ZoneConfig) describe() string {
	if z.Concurrent > 0 {
		return fmt.Sprintf("concurrent %d", z.Concurrent)
	}
	s := fmt.Sprintf("%d / %s", z.Events, time.Duration(z.WindowMs)*time.Millisecond)
	if z.Burst > 0 {
		s += fmt.Sprintf(" burst %d", z.Burst)
	}
	return s
}

// WriteTable writes the report for a terminal.
func (r *Report) WriteTable(w io.Writer) error {
	c := r.Counts
	fmt.Fprintf(w, "Traffic: %s (%s): %d requests", r.Traffic, r.Source, c.Requests)
	if c.Lines > 0 {
		fmt.Fprintf(w, " from %d lines", c.Lines)
	}
	if c.Malformed > 0 || c.Skipped > 0 {
		fmt.Fprintf(w, "; %d malformed, %d skipped", c.Malformed, c.Skipped)
	}
	fmt.Fprintln(w)
	if r.Start != "" {
		fmt.Fprintf(w, "From %s to %s; run in %s (replay: %d lines/s)\n", r.Start, r.End, r.Elapsed, r.LinesPerSecond)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if r.Compare != nil {
		fmt.Fprintf(w, "Zone %s under each algorithm:\n", r.Compare.Zone)
		rows := [][]string{{"algorithm"}, {"limit"}, {"decided"}, {"allowed"}, {"refused"}, {"would refuse"}, {"peak refused/s"}, {"Retry-After p50"}, {"Retry-After max"}}
		for _, z := range r.Compare.Algorithms {
			vals := []string{z.Algorithm, z.describe(), n(z.Decided), n(z.Allowed), n(z.Refused), n(z.WouldRefuse),
				n(z.PeakRefusedPerSecond), secs(z.RetryAfter.P50, z.RetryAfter.Count), secs(z.RetryAfter.Max, z.RetryAfter.Count)}
			for i := range rows {
				rows[i] = append(rows[i], vals[i])
			}
		}
		for _, row := range rows {
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(tw, "zone\talgorithm\tlimit\tdecided\tallowed\trefused\twould refuse\tvetoed\tkeys\tpeak refused/s\tRetry-After p50\tp99\tmax\t")
		for _, z := range r.Zones {
			alg := z.Algorithm
			if z.ReportOnly {
				alg += " (report only)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", z.Name, alg, z.describe(),
				z.Decided, z.Allowed, z.Refused, z.WouldRefuse, z.Vetoed, z.Keys, z.PeakRefusedPerSecond,
				secs(z.RetryAfter.P50, z.RetryAfter.Count), secs(z.RetryAfter.P99, z.RetryAfter.Count), secs(z.RetryAfter.Max, z.RetryAfter.Count))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, z := range r.Zones {
			if len(z.TopKeys) == 0 {
				continue
			}
			fmt.Fprintf(w, "\nKeys refused most in %s:\n", z.Name)
			for _, k := range z.TopKeys {
				fmt.Fprintf(w, "  %-42s %d\n", k.Token, k.Refused)
			}
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "\nNotes:")
		for _, s := range r.Notes {
			fmt.Fprintln(w, "  - "+s)
		}
	}
	return nil
}

func n(v int64) string { return strconv.FormatInt(v, 10) }

func secs(v, count int64) string {
	if count == 0 {
		return "-"
	}
	return strconv.FormatInt(v, 10) + "s"
}
