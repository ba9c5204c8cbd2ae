package console

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/mesh"
)

//go:embed assets
var assets embed.FS

// eventsShown is how many recent events a page lists before live ones arrive.
const eventsShown = 50

// fleetMaxAge is how long pages reuse one read of the fleet (every peer's status).
const fleetMaxAge = 2 * time.Second

var tmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"age":      age,
	"ago":      ago,
	"bytes":    humanBytes,
	"ms":       millis,
	"join":     strings.Join,
	"pathq":    url.PathEscape,
	"clock":    func(t time.Time) string { return t.Local().Format("15:04:05") },
	"rfc3339":  func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"boxname":  boxName,
	"orNone":   func(s string) string { return cmpOr(s, "(no region)") },
	"eventtxt": eventText,
	"plural":   plural,
	"int":      func(n uint64) int { return int(n) },
}).ParseFS(assets, "assets/*.html"))

// page is what every template renders.
type page struct {
	Title   string
	Base    string // relative path to the console's root: "./" or "../"
	Now     time.Time
	Actions bool

	Fleet    fleetview.Fleet
	Regions  []fleetview.Region
	FleetErr string

	Query     string
	Spaces    []fleetview.Space
	More      bool
	SpacesErr string
	// FromBucket names the spaces whose last sync is their manifest's time: this box
	// has no memory of one (lastsync.go).
	FromBucket map[string]bool

	Events  []fleetview.Event
	LastSeq uint64

	Charts chartsView

	Seam seamView

	Space *fleetview.Space
	// Standby is the space's stream on this box (durability standby), nil without one.
	Standby   *box.SpaceStandby
	Wakes     []fleetview.Wake
	Stored    *fleetview.Stored
	StoredErr string
	Notice    string

	// Box is the box page's box.
	Box *boxView
}

func (h *Handler) load(ctx context.Context, p *page, query string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p.Now = time.Now()
	p.Actions = h.actions != nil
	f, err := h.rec.Fleet(ctx, fleetMaxAge)
	if err != nil {
		p.FleetErr = err.Error()
	}
	p.Fleet, p.Regions = f, f.Regions()
	p.Query = query
	sp, err := h.src.Spaces(ctx, query, h.PageSize+1)
	if err != nil {
		p.SpacesErr = err.Error()
	}
	if len(sp) > h.PageSize {
		sp, p.More = sp[:h.PageSize], true
	}
	p.FromBucket = h.fillLastSync(ctx, sp)
	fleetview.Join(sp, f)
	p.Spaces = sp
	p.Events = h.rec.Events(0, eventsShown)
	for i, j := 0, len(p.Events)-1; i < j; i, j = i+1, j-1 {
		p.Events[i], p.Events[j] = p.Events[j], p.Events[i] // newest first
	}
	if len(p.Events) > 0 {
		p.LastSeq = p.Events[0].Seq
	}
	p.Charts = buildCharts(h.rec.Charts(), p.Now)
	p.Seam = h.readSeam()
}

func (h *Handler) serveIndex(w http.ResponseWriter, r *http.Request) error {
	p := &page{Title: "lchat fleet", Base: "./", Notice: doneNotices[r.URL.Query().Get("done")]}
	h.load(r.Context(), p, r.URL.Query().Get("q"))
	return render(w, http.StatusOK, "index.html", p)
}

func (h *Handler) serveSpace(w http.ResponseWriter, r *http.Request, host string) error {
	host = mesh.NormalizeHost(host)
	p := &page{Base: "../", Title: host, Notice: doneNotices[r.URL.Query().Get("done")]}
	h.load(r.Context(), p, host)
	for i := range p.Spaces {
		if p.Spaces[i].Host == host {
			p.Space = &p.Spaces[i]
		}
	}
	if p.Space == nil {
		p.Title = "no such space"
		return render(w, http.StatusNotFound, "space.html", p)
	}
	p.Wakes = h.rec.Wakes(host)
	p.Standby = h.spaceStandby(host)
	if st, ok, err := h.src.Stored(r.Context(), host); err != nil {
		p.StoredErr = err.Error()
	} else if ok {
		p.Stored = &st
	}
	slices.Reverse(p.Wakes) // newest first
	return render(w, http.StatusOK, "space.html", p)
}

// serveFragment renders one section of the index page, for the live updates.
func (h *Handler) serveFragment(w http.ResponseWriter, r *http.Request, name string) error {
	switch name {
	case "fleet", "spaces", "charts", "providers":
	default:
		return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("no fragment %q", name))
	}
	p := &page{Base: "./"}
	h.load(r.Context(), p, r.URL.Query().Get("q"))
	w.Header().Set("Cache-Control", "no-store")
	return render(w, http.StatusOK, name, p)
}

func render(w http.ResponseWriter, status int, name string, p any) error {
	var b strings.Builder
	if err := tmpl.ExecuteTemplate(&b, name, p); err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("rendering %s: %v", name, err))
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, err := w.Write([]byte(b.String()))
	return err
}

func serveStatic(w http.ResponseWriter, r *http.Request, name string) error {
	if strings.HasSuffix(name, ".html") || strings.Contains(name, "..") {
		return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("no asset %q", name))
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return err
	}
	if _, err := fs.Stat(sub, name); err != nil {
		return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("no asset %q", name))
	}
	w.Header().Set("Cache-Control", "public, max-age=300")
	http.ServeFileFS(w, r, sub, name)
	return nil
}

func age(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return d.Round(time.Minute).String()
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return age(time.Since(t)) + " ago"
}

func millis(d time.Duration) string {
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

func humanBytes(n int64) string {
	switch {
	case n <= 0:
		return "–"
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
}

// boxName shortens a SELF URL to its host for tables.
func boxName(self string) string {
	if u, err := url.Parse(self); err == nil && u.Host != "" {
		return u.Host
	}
	return self
}

// plural is "1 thing" or "n things".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// eventText is an event's one-line description.
func eventText(ev fleetview.Event) string {
	var b strings.Builder
	if ev.Host != "" {
		b.WriteString(ev.Host)
	}
	if ev.Box != "" {
		if b.Len() > 0 {
			b.WriteString(" on ")
		}
		b.WriteString(boxName(ev.Box))
	}
	if ev.Phases != nil {
		fmt.Fprintf(&b, " in %s (lease %s, restore %s, fence %s, start %s, ready %s)", millis(ev.Phases.Total()),
			millis(ev.Phases.Lease), millis(ev.Phases.Restore), millis(ev.Phases.Fence), millis(ev.Phases.Start), millis(ev.Phases.Ready))
	}
	if ev.Detail != "" {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(ev.Detail)
	}
	if ev.Err != "" {
		b.WriteString(" — failed: " + ev.Err)
	}
	return b.String()
}
