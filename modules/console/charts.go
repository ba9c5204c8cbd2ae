package console

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/lchat/lchat-caddy/fleetview"
)

// The charts are SVG drawn here, on the server: they need no script and no chart library,
// and the live updates re-fetch them as a fragment.

// chartsView is the charts section.
type chartsView struct {
	Latency  template.HTML
	Requests template.HTML
	Awake    template.HTML
	Held     template.HTML
	DERP     template.HTML // empty without the derp_switch app
}

const (
	chartW, chartH = 360.0, 170.0
	padL, padR     = 40.0, 10.0
	padT, padB     = 12.0, 28.0
)

type series struct {
	name  string
	class string
	pts   []point
	step  bool
}

type point struct {
	t time.Time
	v float64
}

func buildCharts(c fleetview.Charts, now time.Time) chartsView {
	var out chartsView
	out.Latency = histogram("chart-latency", "Wake latency", c.WakeLatency)
	var req, bkt, awake, held, home series
	req = series{name: "requests/min", class: "s1"}
	bkt = series{name: "bucket requests/min", class: "s2"}
	awake = series{name: "awake spaces", class: "s1", step: true}
	held = series{name: "held connections", class: "s2", step: true}
	home = series{name: "DERP home region", class: "s3", step: true}
	for i, s := range c.Samples {
		if i > 0 {
			req.pts = append(req.pts, point{s.At, s.RequestsPerMin})
			bkt.pts = append(bkt.pts, point{s.At, s.BucketPerMin})
		}
		held.pts = append(held.pts, point{s.At, float64(s.Held)})
		home.pts = append(home.pts, point{s.At, float64(s.DERPHome)})
	}
	for _, p := range c.Awake {
		awake.pts = append(awake.pts, point{p.At, p.Value})
	}
	out.Requests = lineChart("chart-requests", "Requests and bucket requests per minute", now, nil, req, bkt)
	out.Awake = lineChart("chart-awake", "Awake spaces over time", now, nil, awake)
	out.Held = lineChart("chart-held", "Held connections (WebSockets and event streams) over time", now, nil, held)
	if c.DERP {
		var marks []time.Time
		for _, ev := range c.DERPSwitches {
			marks = append(marks, ev.At)
		}
		out.DERP = lineChart("chart-derp", "DERP home region and its switches", now, marks, home)
	}
	return out
}

// svgOpen starts an accessible SVG: a title and a description screen readers announce.
func svgOpen(b *strings.Builder, id, title, desc string) {
	fmt.Fprintf(b, `<svg id="%s" class="chart" viewBox="0 0 %g %g" role="img" aria-labelledby="%s-t %s-d" preserveAspectRatio="xMidYMid meet">`,
		id, chartW, chartH, id, id)
	fmt.Fprintf(b, `<title id="%s-t">%s</title><desc id="%s-d">%s</desc>`, id, html.EscapeString(title), id, html.EscapeString(desc))
}

func histogram(id, title string, buckets []fleetview.LatencyBucket) template.HTML {
	var b strings.Builder
	var total, maxN uint64
	var parts []string
	for _, bk := range buckets {
		total += bk.Count
		maxN = max(maxN, bk.Count)
		if bk.Count > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d", bk.Label, bk.Count))
		}
	}
	desc := "No wakes yet."
	if total > 0 {
		desc = fmt.Sprintf("%d wakes. %s.", total, strings.Join(parts, ", "))
	}
	svgOpen(&b, id, title, desc)
	plotW, plotH := chartW-padL-padR, chartH-padT-padB
	axes(&b, 0, float64(maxN), true)
	n := float64(len(buckets))
	bw := plotW / n
	for i, bk := range buckets {
		x := padL + float64(i)*bw
		h := 0.0
		if maxN > 0 {
			h = plotH * float64(bk.Count) / float64(maxN)
		}
		fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d</title></rect>`,
			x+1, padT+plotH-h, bw-2, h, html.EscapeString(bk.Label), bk.Count)
		if bk.Count > 0 {
			fmt.Fprintf(&b, `<text class="val" x="%.1f" y="%.1f">%d</text>`, x+bw/2, padT+plotH-h-2, bk.Count)
		}
		// Every other label one line lower, so neighbours never overlap.
		fmt.Fprintf(&b, `<text class="xl" x="%.1f" y="%.1f">%s</text>`, x+bw/2, chartH-padB+11+float64(i%2)*10, html.EscapeString(strings.TrimPrefix(bk.Label, "≤")))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// axes draws the plot frame and the y range labels.
func axes(b *strings.Builder, lo, hi float64, integer bool) {
	plotH := chartH - padT - padB
	fmt.Fprintf(b, `<line class="axis" x1="%g" y1="%g" x2="%g" y2="%g"/>`, padL, padT+plotH, chartW-padR, padT+plotH)
	fmt.Fprintf(b, `<line class="axis" x1="%g" y1="%g" x2="%g" y2="%g"/>`, padL, padT, padL, padT+plotH)
	format := func(v float64) string {
		if integer || v == math.Trunc(v) {
			return fmt.Sprintf("%.0f", v)
		}
		return fmt.Sprintf("%.1f", v)
	}
	fmt.Fprintf(b, `<text class="yl" x="%g" y="%g">%s</text>`, padL-4, padT+plotH, format(lo))
	fmt.Fprintf(b, `<text class="yl" x="%g" y="%g">%s</text>`, padL-4, padT+8, format(hi))
}

func lineChart(id, title string, now time.Time, marks []time.Time, ss ...series) template.HTML {
	var b strings.Builder
	var t0 time.Time
	hi := 0.0
	var desc []string
	for _, s := range ss {
		for _, p := range s.pts {
			if t0.IsZero() || p.t.Before(t0) {
				t0 = p.t
			}
			hi = max(hi, p.v)
		}
		if len(s.pts) > 0 {
			desc = append(desc, fmt.Sprintf("%s now %s", s.name, trim(s.pts[len(s.pts)-1].v)))
		}
	}
	empty := len(desc) == 0
	if empty {
		desc = append(desc, "No samples yet")
	}
	svgOpen(&b, id, title, strings.Join(desc, "; ")+".")
	if empty {
		fmt.Fprintf(&b, `<text class="empty" x="%g" y="%g">collecting the first samples…</text>`, (padL+chartW-padR)/2, (padT+chartH-padB)/2)
	}
	if hi == 0 {
		hi = 1
	}
	hi = math.Ceil(hi)
	axes(&b, 0, hi, false)
	plotW, plotH := chartW-padL-padR, chartH-padT-padB
	span := now.Sub(t0)
	if t0.IsZero() || span <= 0 {
		span, t0 = time.Minute, now.Add(-time.Minute)
	}
	x := func(t time.Time) float64 { return padL + plotW*float64(t.Sub(t0))/float64(span) }
	y := func(v float64) float64 { return padT + plotH - plotH*v/hi }
	for _, m := range marks {
		if m.Before(t0) {
			continue
		}
		fmt.Fprintf(&b, `<line class="mark" x1="%.1f" y1="%g" x2="%.1f" y2="%g"><title>switch at %s</title></line>`,
			x(m), padT, x(m), padT+plotH, m.Local().Format("15:04:05"))
	}
	for _, s := range ss {
		if len(s.pts) == 0 {
			continue
		}
		var pts []string
		for i, p := range s.pts {
			if s.step && i > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.t), y(s.pts[i-1].v)))
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.t), y(p.v)))
		}
		if s.step {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(now), y(s.pts[len(s.pts)-1].v)))
		}
		fmt.Fprintf(&b, `<polyline class="line %s" points="%s"/>`, s.class, strings.Join(pts, " "))
	}
	// Legend and time axis.
	lx := padL
	for _, s := range ss {
		fmt.Fprintf(&b, `<rect class="key %s" x="%.1f" y="%g" width="10" height="3"/><text class="legend" x="%.1f" y="%g">%s</text>`,
			s.class, lx, chartH-8, lx+13, chartH-5, html.EscapeString(s.name))
		lx += 13 + 6.5*float64(len(s.name)) + 12
	}
	fmt.Fprintf(&b, `<text class="xl" x="%g" y="%g">−%s</text><text class="xl" x="%g" y="%g">now</text>`,
		padL+12, chartH-padB+12, age(span), chartW-padR-10, chartH-padB+12)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func trim(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
