package simulate

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"strconv"
	"strings"
	"time"
)

//go:embed assets/report.html
var reportHTML string

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"chart":  chartSVG,
	"add":    func(a, b int64) int64 { return a + b },
	"deref":  func(s *Series) Series { return *s },
	"retry":  retrySVG,
	"limit":  func(z ZoneReport) string { return z.describe() },
	"bucket": func(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() },
	"pct": func(a, b int64) string {
		if b == 0 {
			return "-"
		}
		return strconv.FormatFloat(100*float64(a)/float64(b), 'f', 1, 64) + "%"
	},
}).Parse(reportHTML))

// WriteHTML writes the self-contained HTML report: inline SVG charts and
// CSS, no script, nothing fetched.
func (r *Report) WriteHTML(w io.Writer) error {
	return reportTmpl.Execute(w, r)
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 720.0, 160.0
	padL, padB     = 48.0, 22.0
	padT, padR     = 10.0, 10.0
)

// chartSVG draws a series as two polylines (allowed, refused), one point
// per bucket, over time from origin.
func chartSVG(s Series, origin, width int64, id string, small bool) template.HTML {
	w, h := chartW, chartH
	if small {
		w, h = 360, 90
	}
	n := len(s.Allowed)
	var peak int64 = 1
	for i := range n {
		peak = max(peak, s.Allowed[i], s.Refused[i])
	}
	iw, ih := w-padL-padR, h-padT-padB
	x := func(i int) float64 {
		if n <= 1 {
			return padL + iw/2
		}
		return padL + iw*float64(i)/float64(n-1)
	}
	y := func(v int64) float64 { return padT + ih - ih*float64(v)/float64(peak) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" id="%s" data-series="2" data-points="%d" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="allowed and refused over time">`,
		template.HTMLEscapeString(id), n, w, h, w, h)
	fmt.Fprintf(&b, `<rect class="frame" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, padL, padT, iw, ih)
	for _, f := range []float64{0, 0.5, 1} {
		v := int64(float64(peak) * f)
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f"/><text class="tick" x="%.1f" y="%.1f" text-anchor="end">%d</text>`,
			padL, padL+iw, y(v), y(v), padL-4, y(v)+4, v)
	}
	if n > 0 {
		start := time.UnixMilli(origin).UTC()
		end := time.UnixMilli(origin + int64(n)*width).UTC()
		layout := "15:04:05"
		if end.Sub(start) > 48*time.Hour {
			layout = "Jan 2 15:04"
		}
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f">%s</text><text class="tick" x="%.1f" y="%.1f" text-anchor="end">%s</text>`,
			padL, h-6, start.Format(layout), padL+iw, h-6, end.Format(layout))
	}
	for _, ser := range []struct {
		class string
		v     []int64
	}{{"allowed", s.Allowed}, {"refused", s.Refused}} {
		fmt.Fprintf(&b, `<polyline class="series %s" data-points="%d" points="`, ser.class, len(ser.v))
		for i, v := range ser.v {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.1f,%.1f", x(i), y(v))
		}
		b.WriteString(`"/>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// retrySVG draws the Retry-After distribution as bars.
func retrySVG(d RetryDist, id string) template.HTML {
	const w, h = 360.0, 120.0
	n := len(d.Buckets)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="retry" id="%s" data-bars="%d" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="Retry-After distribution">`,
		template.HTMLEscapeString(id), n, w, h, w, h)
	if n == 0 {
		fmt.Fprintf(&b, `<text class="tick" x="%.0f" y="%.0f" text-anchor="middle">no refusals</text></svg>`, w/2, h/2)
		return template.HTML(b.String())
	}
	bw := (w - 10) / float64(n)
	var prev int64
	for i, bk := range d.Buckets {
		c := bk.Count - prev // the buckets are cumulative
		prev = bk.Count
		bh := (h - 36) * float64(c) / float64(max(d.Count, 1))
		x := 5 + float64(i)*bw
		fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d</title></rect>`,
			x+2, h-20-bh, bw-4, bh, template.HTMLEscapeString(leLabel(d.Buckets, i)), c)
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x+bw/2, h-6, template.HTMLEscapeString(bk.Le))
		if c > 0 {
			fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f" text-anchor="middle">%d</text>`, x+bw/2, h-24-bh, c)
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func leLabel(bs []RetryBucket, i int) string {
	if i == 0 {
		return "≤ " + bs[0].Le + "s"
	}
	if bs[i].Le == "+Inf" {
		return "> " + bs[i-1].Le + "s"
	}
	return bs[i-1].Le + "s < Retry-After ≤ " + bs[i].Le + "s"
}
