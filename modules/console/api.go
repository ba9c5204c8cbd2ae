package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/fleetview"
)

// serveAPI answers the console's JSON: fleet, spaces?q=, providers, box?self=, charts,
// events?after=.
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request, name string) error {
	ctx := r.Context()
	var v any
	switch name {
	case "fleet":
		f, err := h.rec.Fleet(ctx, fleetMaxAge)
		if err != nil {
			return caddyhttp.Error(http.StatusBadGateway, fmt.Errorf("reading the fleet: %v", err))
		}
		v = f
	case "spaces":
		sp, err := h.src.Spaces(ctx, r.URL.Query().Get("q"), h.PageSize)
		if err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("listing spaces: %v", err))
		}
		h.fillLastSync(ctx, sp)
		if f, err := h.rec.Fleet(ctx, fleetMaxAge); err == nil {
			fleetview.Join(sp, f)
		}
		v = h.readSeam().withSeam(sp)
	case "providers":
		v = h.readSeam().apiProviders()
	case "box":
		bs, err := h.apiBox(ctx, r.URL.Query().Get("self"))
		if err != nil {
			return err
		}
		v = bs
	case "charts":
		v = h.rec.Charts()
	case "events":
		after, err := parseSeq(r.URL.Query().Get("after"))
		if err != nil {
			return caddyhttp.Error(http.StatusBadRequest, err)
		}
		v = h.rec.Events(after, 0)
	default:
		return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("no console API %q", name))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	return json.NewEncoder(w).Encode(v)
}

func parseSeq(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("after: not an event sequence number: %q", s)
	}
	return n, nil
}

// sseKeepAlive is the interval of comment lines that keep idle proxies from closing the
// stream.
const sseKeepAlive = 15 * time.Second

// serveEvents streams events as server-sent events: first those after Last-Event-ID (or
// ?after=), then live ones, until the client goes away.
func (h *Handler) serveEvents(w http.ResponseWriter, r *http.Request) error {
	after, err := parseSeq(r.Header.Get("Last-Event-ID"))
	if err == nil && after == 0 {
		after, err = parseSeq(r.URL.Query().Get("after"))
	}
	if err != nil {
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	live, cancel := h.rec.Subscribe()
	defer cancel()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(ev fleetview.Event) error {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", ev.Seq, b); err != nil {
			return err
		}
		after = ev.Seq
		return nil
	}
	if after > 0 {
		for _, ev := range h.rec.Events(after, 0) {
			if err := send(ev); err != nil {
				return nil
			}
		}
	}
	if _, err := fmt.Fprint(w, "retry: 2000\n: live\n\n"); err != nil {
		return nil
	}
	rc.Flush()
	tick := time.NewTicker(sseKeepAlive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case ev, ok := <-live:
			if !ok {
				return nil
			}
			if ev.Seq <= after {
				continue // already replayed
			}
			if err := send(ev); err != nil {
				return nil
			}
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return nil
			}
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
	}
}
