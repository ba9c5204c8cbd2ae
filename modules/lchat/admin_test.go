package lchat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/spacestore"
)

// testApp is an app over a test box (boxtest.Open).
func testApp(t testing.TB, o boxtest.Options) *App {
	t.Helper()
	return &App{box: boxtest.Open(t, o)}
}

func newTestAdmin(t testing.TB) *adminAPI {
	t.Helper()
	return &adminAPI{appRef{testApp(t, boxtest.Options{})}}
}

// adminDo serves one admin request and returns its status and body (an error's message).
func adminDo(a *adminAPI, method, path string, body any) (int, string) {
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(body)
	w := httptest.NewRecorder()
	err := a.serve(w, httptest.NewRequest(method, "http://localhost:2019"+path, &buf))
	if err != nil {
		if ae, ok := err.(caddy.APIError); ok {
			return ae.HTTPStatus, ae.Err.Error()
		}
		return 0, err.Error()
	}
	return w.Code, w.Body.String()
}

// TestCreateRouteConcurrent: concurrent creates of one host give exactly one 201; every
// other caller gets 409, and the stored route is the winner's.
func TestCreateRouteConcurrent(t *testing.T) {
	a := newTestAdmin(t)
	const n = 24
	codes := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			codes[i], _ = adminDo(a, "POST", "/lchat/routes", map[string]any{
				"host": "dup.example.com", "kind": "demo", "version": strings.Repeat("v", i+1)})
		}()
	}
	close(start)
	wg.Wait()
	created, conflict := 0, 0
	winner := 0
	for i, c := range codes {
		switch c {
		case http.StatusCreated:
			created++
			winner = i
		case http.StatusConflict:
			conflict++
		default:
			t.Errorf("create %d: status %d", i, c)
		}
	}
	if created != 1 || conflict != n-1 {
		t.Fatalf("%d x 201 and %d x 409 of %d concurrent creates, want exactly one 201", created, conflict, n)
	}
	if rt, _ := a.app.box.Registry().Lookup("dup.example.com"); rt.Version != strings.Repeat("v", winner+1) {
		t.Fatalf("stored version %q is not the 201's", rt.Version)
	}
}

// TestCreateRouteHomeRegion: a home_region that is not a short lowercase label is a 400
// and stores nothing.
func TestCreateRouteHomeRegion(t *testing.T) {
	a := newTestAdmin(t)
	for _, bad := range []string{"EU", "eu west", "eu_1", strings.Repeat("r", 33), "eu/1"} {
		code, msg := adminDo(a, "POST", "/lchat/routes", map[string]any{"host": "r.example.com", "kind": "demo", "home_region": bad})
		if code != http.StatusBadRequest || !strings.Contains(msg, "home_region") {
			t.Errorf("home_region %q: %d %q, want 400 naming home_region", bad, code, msg)
		}
	}
	if n := a.app.box.Registry().Len(); n != 0 {
		t.Fatalf("%d routes stored by refused creates", n)
	}
	if code, msg := adminDo(a, "POST", "/lchat/routes", map[string]any{"host": "r.example.com", "kind": "demo", "home_region": "eu-west-1"}); code != http.StatusCreated {
		t.Fatalf("valid home_region: %d %s", code, msg)
	}
}

// TestDeleteRouteDeletesWakeRecord: removing a route, hibernating or live (a space once,
// before hibernation was turned off), deletes its scheduled wake record, so no box
// keeps scanning a wake for a host that no longer exists.
func TestDeleteRouteDeletesWakeRecord(t *testing.T) {
	a := newTestAdmin(t)
	b := a.app.box.Bucket()
	for _, body := range []map[string]any{
		{"host": "space.example.com", "kind": "demo"},
		{"host": "live.example.com", "upstream": "127.0.0.1:9"},
	} {
		host := body["host"].(string)
		if code, msg := adminDo(a, "POST", "/lchat/routes", body); code != http.StatusCreated {
			t.Fatalf("create %s: %d %s", host, code, msg)
		}
		if _, err := spacestore.PutWake(context.Background(), b, host, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if code, msg := adminDo(a, "DELETE", "/lchat/routes/"+host, nil); code != http.StatusOK {
			t.Fatalf("delete %s: %d %s", host, code, msg)
		}
		if _, err := b.Head(context.Background(), spacestore.WakeKey(host)); !errors.Is(err, bucket.ErrNotFound) {
			t.Errorf("%s: wake record after the route was removed: %v", host, err)
		}
	}
}
