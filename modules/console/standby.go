package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/box"
)

// StandbySource is what the console reads of the warm standbys (durability standby): an
// awake space's stream and what a box stands by for. The lchat app's fleet view
// (box.Console) offers it; a source without it shows neither.
type StandbySource interface {
	// SpaceStandby reads host's stream on this box; ok false when the space is not awake
	// here or its kind's durability is not standby.
	SpaceStandby(host string) (box.SpaceStandby, bool)
	// BoxStandby reads what the box self stands by for, and its totals ("": this box).
	// A name that is not a live box of the mesh is an error, never dialled.
	BoxStandby(ctx context.Context, self string) (box.BoxStandby, error)
}

// boxView is the box page: one box of the fleet and what it stands by for.
type boxView struct {
	Self    string
	This    bool
	Standby box.BoxStandby
	Err     string
}

// serveBox renders the page of the box ?self= (this box without it): the spaces it stands
// by for and its takeovers.
func (h *Handler) serveBox(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	p := &page{Base: "./", Now: time.Now(), Actions: h.actions != nil, Seam: h.readSeam()}
	v, status := h.readBox(ctx, r.URL.Query().Get("self"), p)
	p.Box, p.Title = v, boxName(v.Self)
	if status == http.StatusNotFound {
		p.Title = "no such box"
	}
	return render(w, status, "box.html", p)
}

// readBox reads the box self ("": this box) of the fleet into p.Fleet and its view, with
// the status to answer: 404 for a name the fleet does not list (never dialled), 502 when
// its status could not be read.
func (h *Handler) readBox(ctx context.Context, self string, p *page) (*boxView, int) {
	f, err := h.rec.Fleet(ctx, fleetMaxAge)
	if err != nil {
		p.FleetErr = err.Error()
	}
	p.Fleet = f
	if self == "" {
		self = f.Self
	}
	v := &boxView{Self: self}
	found := false
	for _, b := range f.Boxes {
		if b.Self == self {
			found, v.This = true, b.This
		}
	}
	switch {
	case !found:
		v.Err = fmt.Sprintf("the fleet lists no live box %q", self)
		return v, http.StatusNotFound
	case h.stby == nil:
		v.Err = "this console's source shows no standby"
		return v, http.StatusOK
	}
	if v.This {
		self = "" // this box, whatever the fleet calls it
	}
	if v.Standby, err = h.stby.BoxStandby(ctx, self); err != nil {
		v.Err = err.Error()
		return v, http.StatusBadGateway
	}
	return v, http.StatusOK
}

// apiBox answers /api/box?self=: what the box stands by for (BoxStandby).
func (h *Handler) apiBox(ctx context.Context, self string) (any, error) {
	v, status := h.readBox(ctx, self, new(page))
	switch {
	case status != http.StatusOK:
		return nil, caddyhttp.Error(status, errors.New(v.Err))
	case h.stby == nil:
		return nil, caddyhttp.Error(http.StatusNotFound, errors.New(v.Err))
	}
	return v.Standby, nil
}

// spaceStandby is host's stream on this box for its page, nil when it has none here.
func (h *Handler) spaceStandby(host string) *box.SpaceStandby {
	if h.stby == nil {
		return nil
	}
	if s, ok := h.stby.SpaceStandby(host); ok {
		return &s
	}
	return nil
}
