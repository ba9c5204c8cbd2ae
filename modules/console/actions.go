package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/mesh"
)

// actionNames maps an action's path to its title on the confirmation page.
var actionNames = map[string]string{
	"hibernate": "Hibernate now",
	"relocate":  "Relocate",
	"remove":    "Remove",
}

// serveAction runs a write action. Every action is a POST from the console's own pages
// (a cross-site form cannot ride the operator's credentials), and runs only once the
// operator confirmed it: a first POST renders the confirmation page, whose form repeats
// it with confirm=<host>. A refused or failed action answers the status the box gives its
// error (box.StatusOf), as the admin API does: 404 no such route, 409 not now, 500 an
// unexpected failure.
func (h *Handler) serveAction(w http.ResponseWriter, r *http.Request, name string) error {
	if h.actions == nil {
		return caddyhttp.Error(http.StatusNotFound, errors.New("console actions are off (enable them with `actions` in lchat_console)"))
	}
	title, ok := actionNames[name]
	if !ok {
		return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("no console action %q", name))
	}
	if r.Method != http.MethodPost {
		return caddyhttp.Error(http.StatusMethodNotAllowed, errors.New("actions are POSTs"))
	}
	if !sameOrigin(r) {
		return caddyhttp.Error(http.StatusForbidden, errors.New("cross-site action refused"))
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if err := r.ParseForm(); err != nil {
		return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading the form: %v", err))
	}
	rawHost := r.PostForm.Get("host")
	host := mesh.NormalizeHost(rawHost)
	region := strings.TrimSpace(r.PostForm.Get("region"))
	moveDNS := r.PostForm.Get("move_dns") == "on"
	if strings.TrimSpace(rawHost) == "" {
		return caddyhttp.Error(http.StatusBadRequest, errors.New("host: required"))
	}
	if host == "" {
		return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("host: %q is not a host name", rawHost))
	}
	if name == "relocate" && region == "" {
		return caddyhttp.Error(http.StatusBadRequest, errors.New("region: required to relocate"))
	}
	p := &page{Base: "../", Title: title + " " + host}
	h.load(r.Context(), p, host)
	if r.PostForm.Get("confirm") != host {
		return render(w, http.StatusOK, "confirm.html", &confirmPage{page: p, Action: name, ActionTitle: title, Host: host, Region: region, MoveDNS: moveDNS})
	}
	var err error
	switch name {
	case "hibernate":
		err = h.actions.Hibernate(r.Context(), host)
	case "relocate":
		err = h.actions.Relocate(r.Context(), host, region, moveDNS)
	case "remove":
		err = h.actions.Remove(r.Context(), host)
	}
	if err != nil {
		return caddyhttp.Error(box.StatusOf(err), fmt.Errorf("%s %s: %w", strings.ToLower(title), host, err))
	}
	h.logger.Info("console action", zap.String("action", name), zap.String("host", host), zap.String("region", region))
	next := "../space/" + url.PathEscape(host) + "?done=" + name
	if name == "remove" {
		next = "../?q=" + url.QueryEscape(host) + "&done=" + name
	}
	// A relative Location, resolved by the browser against the URL it posted to, so the
	// console keeps working when a site mounts it under a path (handle_path /console/*).
	w.Header().Set("Location", next)
	w.WriteHeader(http.StatusSeeOther)
	return nil
}

// doneNotices are what a page says after an action it was redirected from.
var doneNotices = map[string]string{
	"hibernate": "Hibernated: checkpointed to the bucket, lease released.",
	"relocate":  "Relocated.",
	"remove":    "Removed (its data stays in the bucket).",
}

// confirmPage is the confirmation of one action.
type confirmPage struct {
	*page
	Action, ActionTitle, Host, Region string
	MoveDNS                           bool
}

// sameOrigin reports whether a POST came from a page of this site: the browser's
// Sec-Fetch-Site, else the Origin header, must name this host.
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin":
		return true
	case "":
	default:
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}
