package held

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/mesh"
)

// servePeer serves one peer call on c: the answer's status when served, or the
// *box.Error's status when refused (then nothing may be written).
func servePeer(t *testing.T, c *Conns, method, path, body string) int {
	t.Helper()
	r := httptest.NewRequest(method, "https://box-a.example.net/", strings.NewReader(body))
	r.URL.Path = path // as the mux hands it on: unescaped once
	w := httptest.NewRecorder()
	err := c.ServePeer(w, r)
	if err == nil {
		return w.Code
	}
	var be *box.Error
	if !errors.As(err, &be) {
		t.Fatalf("%s %s: %v is not a *box.Error", method, path, err)
	}
	if w.Body.Len() != 0 {
		t.Errorf("%s %s: refused (%d) with a body written: %q", method, path, be.Status, w.Body)
	}
	return be.Status
}

// TestServePeer: the peer API's held-connection calls answer what they are; a malformed
// call is refused with its status before it acts.
func TestServePeer(t *testing.T) {
	b, _ := boxtest.MeshBox(t)
	c := openConns(t, b)
	const notice, awake = mesh.PathConns + "notice", mesh.PathConns + "awake"
	for _, tc := range []struct {
		name, method, path, body string
		want                     int
	}{
		{"notice", "POST", notice, `{"space":"s1.example.com","at":"https://box-b.example.net inc-1 i-1","covered":3}`, 204},
		{"malformed notice", "POST", notice, `{"space":`, 400},
		{"notice naming no instance", "POST", notice, `{"space":"s1.example.com","at":"box-b"}`, 400},
		{"GET of the notice", "GET", notice, "", 405},
		{"announcement", "POST", awake, `{"at":"https://box-b.example.net","hosts":["s1.example.com"]}`, 204},
		{"malformed announcement", "POST", awake, `["s1.example.com"]`, 400},
		{"announcement naming no box", "POST", awake, `{"hosts":["s1.example.com"]}`, 400},
		{"announcement from a box not in the mesh", "POST", awake,
			`{"at":"https://box-c.example.net","hosts":["s1.example.com"]}`, 400},
		{"GET of the announcement", "GET", awake, "", 405},
		{"control call on the connections held here", "GET", mesh.PathConns + "s1.example.com/ws/conns", "", 200},
		{"host not normalized in the path", "GET", mesh.PathConns + "S1.Example.com/ws/conns", "", 400},
		{"host that does not unescape", "GET", mesh.PathConns + "s1%zz/ws/conns", "", 400},
		{"GET of a checkpoint", "GET", mesh.PathConns + "s1.example.com/checkpoint", "", 405},
		{"unknown call", "POST", mesh.PathConns + "nosuch", "", 404},
		{"call without a host", "POST", mesh.PathConns + "/checkpoint", "", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := servePeer(t, c, tc.method, tc.path, tc.body); got != tc.want {
				t.Fatalf("%s %s: %d, want %d", tc.method, tc.path, got, tc.want)
			}
		})
	}
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestWakeAnnouncement: a live peer's announcement that a space woke there wakes the
// streams held here for it (its wake signal) and names that peer as where the space is
// awake (announcedAt), so the streams reopen there; an announcement from a box that is
// not a live member, and a host not in the normalized form every comparison of hosts
// uses, change nothing.
func TestWakeAnnouncement(t *testing.T) {
	b, _ := boxtest.MeshBox(t)
	c := openConns(t, b)
	const host, upper = "s1.example.com", "S2.Example.com"
	woke, wokeUpper, wokeLower := c.wakeSignal(host), c.wakeSignal(upper), c.wakeSignal(strings.ToLower(upper))

	body := `{"at":"https://box-c.example.net","hosts":["` + host + `"]}`
	if got := servePeer(t, c, "POST", mesh.PathConns+"awake", body); got != http.StatusBadRequest {
		t.Fatalf("an announcement from a box not in the mesh: %d, want 400", got)
	}
	if closed(woke) || c.announcedAt(host) != "" {
		t.Fatalf("a stranger's announcement woke %s (at %q)", host, c.announcedAt(host))
	}

	body = `{"at":"` + boxtest.SelfB + `","hosts":["` + host + `","` + upper + `"]}`
	if got := servePeer(t, c, "POST", mesh.PathConns+"awake", body); got != http.StatusNoContent {
		t.Fatalf("a live peer's announcement: %d, want 204", got)
	}
	if !closed(woke) {
		t.Errorf("the announcement did not signal %s's wake", host)
	}
	if at := c.announcedAt(host); at != boxtest.SelfB {
		t.Errorf("announcedAt(%s) = %q, want %q", host, at, boxtest.SelfB)
	}
	if closed(wokeUpper) || closed(wokeLower) || c.announcedAt(upper) != "" || c.announcedAt(strings.ToLower(upper)) != "" {
		t.Errorf("a host not normalized (%s) was taken", upper)
	}
	if closed(c.wakeSignal(host)) {
		t.Errorf("the next wake signal of %s is already closed", host)
	}
}
