package provider

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// The moves' tests: a fake fleet (Fleet over a membucket) moving testHost to the real
// provider API (API over a fake Hosting, behind an in-process TLS server), with a fault
// at each step of each move.

const (
	partner = "partner"
	// spaceSecret is the moved space's own env value; otherSecret another space's.
	spaceSecret = "own-env-value-of-the-moved-space"
	otherSecret = "env-value-of-another-space-of-the-fleet"
)

// errDied is the panic of a fake fleet whose box died mid-move.
var errDied = errors.New("the box running the move died")

// fakeFleet is the fleet's side of a move: its routes and its bucket, with faults.
type fakeFleet struct {
	bkt *membucket.Counting
	tmp string
	// dead: the box running the move died; every later call panics with errDied, so
	// nothing after it (an undo) runs.
	dead atomic.Bool

	mu     sync.Mutex
	routes map[string]registry.Route
	// failSet, when set, is asked before SetDelegation stores a delegation
	// ("provider/state"): an error fails it, nothing stored.
	failSet func(d string) error
	// dieAt, when set, is asked at each SetDelegation: the box dies there, before the
	// row is stored or after.
	dieAt func(d string) (before, after bool)
}

func newFakeFleet(t *testing.T) *fakeFleet {
	return &fakeFleet{bkt: membucket.NewCounting(membucket.New()), tmp: t.TempDir(), routes: map[string]registry.Route{
		testHost:            {Host: testHost, Kind: "demo", Hibernate: true, Env: map[string]string{"DEMO_SECRET": spaceSecret}},
		"other.example.com": {Host: "other.example.com", Kind: "demo", Hibernate: true, Env: map[string]string{"DEMO_SECRET": otherSecret}},
	}}
}

func (f *fakeFleet) alive() {
	if f.dead.Load() {
		panic(errDied)
	}
}

func (f *fakeFleet) Route(host string) (registry.Route, error) {
	f.alive()
	f.mu.Lock()
	defer f.mu.Unlock()
	rt, ok := f.routes[host]
	if !ok {
		return registry.Route{}, registry.ErrNotFound
	}
	return rt, nil
}

func (f *fakeFleet) SetDelegation(ctx context.Context, host, provider, state string) (registry.Route, error) {
	f.alive()
	d := provider + "/" + state
	die := func(bool, bool) (bool, bool) { return false, false }
	if f.dieAt != nil {
		die = func(bool, bool) (bool, bool) { return f.dieAt(d) }
	}
	before, after := die(false, false)
	if before {
		f.dead.Store(true)
		panic(errDied)
	}
	if f.failSet != nil {
		if err := f.failSet(d); err != nil {
			return registry.Route{}, err
		}
	}
	f.mu.Lock()
	rt, ok := f.routes[host]
	if !ok {
		f.mu.Unlock()
		return registry.Route{}, registry.ErrNotFound
	}
	rt.Provider, rt.ProviderState = provider, state
	f.routes[host] = rt
	f.mu.Unlock()
	if after {
		f.dead.Store(true)
		panic(errDied)
	}
	return rt, nil
}

func (f *fakeFleet) Delegated(provider string) int {
	f.alive()
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, rt := range f.routes {
		if rt.Provider == provider {
			n++
		}
	}
	return n
}

func (f *fakeFleet) Bucket() bucket.Bucket           { f.alive(); return f.bkt }
func (f *fakeFleet) KeepsState(registry.Route) error { f.alive(); return nil }
func (f *fakeFleet) Live() spacestore.LiveFunc       { f.alive(); return never }
func (f *fakeFleet) TempDir() string                 { f.alive(); return f.tmp }
func (f *fakeFleet) route(t *testing.T) (provider, state string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	rt := f.routes[testHost]
	return rt.Provider, rt.ProviderState
}

// fakeHosting is the provider's fleet (Hosting): its routes and its bucket.
type fakeHosting struct {
	bkt *membucket.Counting
	tmp string

	mu     sync.Mutex
	routes map[string]registry.Route
}

func (h *fakeHosting) Lookup(host string) (*registry.Route, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rt, ok := h.routes[host]
	if !ok {
		return nil, false
	}
	return &rt, true
}

func (h *fakeHosting) Hosted(client string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, rt := range h.routes {
		if rt.HostedFor == client {
			n++
		}
	}
	return n
}

// CreateHosted creates the route held, as the contract says (box.Box.CreateHosted).
func (h *fakeHosting) CreateHosted(ctx context.Context, spec registry.Spec, client string) (registry.Route, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.routes[spec.Host]; ok {
		return registry.Route{}, fmt.Errorf("route %s exists", spec.Host)
	}
	rt := registry.Route{Host: spec.Host, Kind: spec.Kind, Version: spec.Version, Env: spec.Env, Hibernate: true,
		HostedFor: client, ProviderState: registry.ProviderReclaiming}
	h.routes[spec.Host] = rt
	return rt, nil
}

func (h *fakeHosting) SetHeld(ctx context.Context, host string, held bool) (registry.Route, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rt, ok := h.routes[host]
	if !ok {
		return registry.Route{}, registry.ErrNotFound
	}
	rt.ProviderState = ""
	if held {
		rt.ProviderState = registry.ProviderReclaiming
	}
	h.routes[host] = rt
	return rt, nil
}

func (h *fakeHosting) Remove(ctx context.Context, host string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.routes, host)
	return nil
}

func (h *fakeHosting) Bucket() bucket.Bucket     { return h.bkt }
func (h *fakeHosting) Live() spacestore.LiveFunc { return never }
func (h *fakeHosting) TempDir() string           { return h.tmp }

// route is the provider's route of testHost: "none", "held" or "serving".
func (h *fakeHosting) route() string {
	rt, ok := h.Lookup(testHost)
	switch {
	case !ok:
		return "none"
	case rt.ProviderState != "":
		return "held"
	}
	return "serving"
}

// A fault of the test provider's answer to one call.
type fault int

const (
	// refused: answered 503, nothing done.
	refused fault = iota + 1
	// lost: done, and the connection closed before the answer.
	lost
	// badSignature: the export signed with a key the fleet does not accept.
	badSignature
)

// recorded is one request the fleet sent the test provider.
type recorded struct {
	call   string
	header http.Header
	body   []byte
}

// testProvider serves the provider API (API over a fakeHosting) on an in-process TLS
// server, as modules/lchat's glue does, with a fault per call ("PUT space", "PUT state",
// "POST hibernate", "POST resume", "GET export", "DELETE space", "GET space"), and
// records every request.
type testProvider struct {
	h       *fakeHosting
	api     *API
	clients Clients
	srv     *httptest.Server

	mu     sync.Mutex
	faults map[string]fault
	// done, when set, hears each call once it was carried out, before its answer.
	done func(call string)
	// senderDead, when set and true, drops every call: the box sending it died before
	// it could.
	senderDead func() bool
	reqs       []recorded
}

func newTestProvider(t *testing.T) (*testProvider, *Conn) {
	h := &fakeHosting{bkt: membucket.NewCounting(membucket.New()), tmp: t.TempDir(), routes: map[string]registry.Route{}}
	p := &testProvider{h: h, api: &API{F: h}, faults: map[string]fault{},
		clients: Clients{{Name: "fleet-a", Token: keyA, SignToken: keyB, Domains: []string{"example.com"}}}}
	p.srv = httptest.NewTLSServer(p)
	t.Cleanup(p.srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(p.srv.Certificate())
	c, err := NewConn(&Provider{Name: partner, URL: p.srv.URL, Token: keyA, AcceptToken: keyB, Domains: []string{"example.com"}},
		ConnOptions{Roots: roots}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return p, c
}

func (p *testProvider) setFaults(faults map[string]fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = faults
}

func (p *testProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.senderDead != nil && p.senderDead() {
		apiError(w, http.StatusServiceUnavailable, errors.New("sent by a dead box"))
		return
	}
	body, _ := io.ReadAll(r.Body)
	c := p.clients.Authenticate(r)
	host, op, ok := SplitPath(r.URL.Path)
	name := op
	if name == OpSpace {
		name = "space"
	}
	call := r.Method + " " + name
	p.mu.Lock()
	p.reqs = append(p.reqs, recorded{call: call, header: r.Header.Clone(), body: body})
	f, done := p.faults[call], p.done
	p.mu.Unlock()
	switch {
	case c == nil:
		apiError(w, http.StatusUnauthorized, errors.New("no such client"))
		return
	case !ok:
		apiError(w, http.StatusNotFound, errors.New("no such operation"))
		return
	case f == refused:
		apiError(w, http.StatusServiceUnavailable, errors.New("refused by the test"))
		return
	}
	ctx := r.Context()
	var v any
	var err error
	status := http.StatusOK
	switch call {
	case "GET space":
		v, err = p.api.Status(ctx, c, host)
	case "PUT space":
		var req CreateRequest
		if err = json.Unmarshal(body, &req); err == nil {
			var created bool
			v, created, err = p.api.Host(ctx, c, host, req)
			if created {
				status = http.StatusCreated
			}
		}
	case "DELETE space":
		err, status = p.api.Delete(ctx, c, host), http.StatusNoContent
	case "PUT state":
		v, err = p.api.Import(ctx, c, host, strings.NewReader(string(body)))
	case "POST hibernate":
		v, err = p.api.Hibernate(ctx, c, host)
	case "POST resume":
		v, err = p.api.Resume(ctx, c, host)
	case "GET export":
		if f == badSignature {
			other := *c
			other.SignToken = keyA
			c = &other
		}
		begun := false
		err = p.api.Export(ctx, c, host, func() io.Writer {
			begun = true
			w.Header().Set("Content-Type", ExportContentType)
			w.WriteHeader(http.StatusOK)
			return w
		})
		if begun {
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			if done != nil {
				done(call)
			}
			return
		}
	default:
		apiError(w, http.StatusMethodNotAllowed, errors.New("method not allowed"))
		return
	}
	if done != nil {
		done(call)
	}
	if f == lost {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
		return
	}
	if err != nil {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, ErrNotYours):
			status = http.StatusNotFound
		case errors.Is(err, ErrBadExport):
			status = http.StatusBadRequest
		case errors.Is(err, ErrNotHeld), errors.Is(err, ErrCap):
			status = http.StatusConflict
		}
		apiError(w, status, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if v != nil {
		json.NewEncoder(w).Encode(v)
	}
}

func apiError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

// The next scheduled wakes the space's manifests carry: the fleet's before the
// delegation, the provider's after it ran there.
var (
	fleetWake = time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	provWake  = time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second)
)

// seedSpace stores generation gen of testHost in b, its manifest carrying wake.
func seedSpace(t *testing.T, b bucket.Bucket, gen int64, text string, wake time.Time) {
	t.Helper()
	checkpointIn(t, b, gen, map[string]string{"data/notes.txt": text})
	ctx := context.Background()
	m, etag, err := spacestore.ReadManifest(ctx, b, testHost)
	if err != nil {
		t.Fatal(err)
	}
	m.NextWake = &wake
	if _, err := spacestore.WriteManifest(ctx, b, testHost, m, etag); err != nil {
		t.Fatal(err)
	}
}

// wakeIn is testHost's scheduled-wake record in b (zero: none).
func wakeIn(t *testing.T, b bucket.Bucket) time.Time {
	t.Helper()
	recs, _, err := (&spacestore.WakeScanner{Bucket: b}).Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Host == testHost {
			return r.At
		}
	}
	return time.Time{}
}

// moveRig is a fleet with testHost (generation 3, its next wake fleetWake) and the
// provider it moves to.
type moveRig struct {
	f *fakeFleet
	p *testProvider
	c *Conn
}

func newMoveRig(t *testing.T) *moveRig {
	f := newFakeFleet(t)
	seedSpace(t, f.bkt, 3, "written at home", fleetWake)
	if _, err := spacestore.PutWake(context.Background(), f.bkt, testHost, fleetWake); err != nil {
		t.Fatal(err)
	}
	p, c := newTestProvider(t)
	return &moveRig{f: f, p: p, c: c}
}

// run runs move, the box's death (errDied) recovered: died true.
func (r *moveRig) run(move func() (Moved, error)) (res Moved, err error, died bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != errDied {
				panic(v)
			}
			died = true
		}
	}()
	res, err = move()
	return res, err, false
}

func (r *moveRig) delegate(t *testing.T) (Moved, error, bool) {
	return r.run(func() (Moved, error) { return Delegate(t.Context(), r.f, r.c, testHost) })
}

func (r *moveRig) reclaim(t *testing.T) (Moved, error, bool) {
	return r.run(func() (Moved, error) { return Reclaim(t.Context(), r.f, r.c, testHost, Limits{}) })
}

// delegated delegates testHost with no fault, and has it run at the provider: its
// state there is generation 5, its next wake provWake.
func (r *moveRig) delegated(t *testing.T) {
	t.Helper()
	if _, err, _ := r.delegate(t); err != nil {
		t.Fatalf("delegating: %v", err)
	}
	r.check(t, "after the delegation", partner, "", "serving", nil)
	seedSpace(t, r.p.h.bkt, 5, "written at the provider", provWake)
	// The fleet's scan dropped its record of the wake, due or not, while the space was
	// not the fleet's to run.
	if err := spacestore.DeleteWake(context.Background(), r.f.bkt, testHost, ""); err != nil {
		t.Fatal(err)
	}
}

// check asserts where testHost stands: the fleet's route (provider, state), the
// provider's route ("none", "held", "serving"), and the one rule of every move, that
// exactly one side can serve or run it: a route the provider serves (and may wake on
// schedule) only while the fleet's names it, and a scheduled wake recorded only on the
// side that serves it. err is the move's error: one that leaves neither side serving
// must say so. Neither tokens nor env values are ever in it.
func (r *moveRig) check(t *testing.T, step, wantProv, wantState, wantAt string, err error) {
	t.Helper()
	prov, state := r.f.route(t)
	at := r.p.h.route()
	if prov != wantProv || state != wantState || at != wantAt {
		t.Fatalf("%s: fleet route %q/%q, provider %s; want %q/%q, %s (err %v)", step, prov, state, at, wantProv, wantState, wantAt, err)
	}
	fleetServes := prov == "" && state == ""
	provServes := prov == partner && state == "" && at == "serving"
	if fleetServes && at == "serving" {
		t.Fatalf("%s: the fleet serves the space and the provider has a serving route of it too (err %v)", step, err)
	}
	if !fleetServes && !provServes && (err == nil || !strings.Contains(err.Error(), "neither side")) {
		t.Fatalf("%s: neither side serves the space, and the error does not say so: %v", step, err)
	}
	if err != nil {
		for _, secret := range []string{string(keyA), string(keyB), spaceSecret, otherSecret} {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("%s: the error carries a secret: %v", step, err)
			}
		}
	}
}

// TestDelegateFailingAtEachStep: a delegation that fails at any step is undone: the
// fleet serves the space as before and the provider keeps no route that serves it or
// wakes it (deleted; held asleep when its delete failed too, which the error names);
// a failure that leaves it to neither side says so. Re-running the delegation then
// completes it: the provider serves the space, with the fleet's state and its next
// scheduled wake.
func TestDelegateFailingAtEachStep(t *testing.T) {
	for _, tc := range []struct {
		name    string
		faults  map[string]fault
		failSet string // the fleet's SetDelegation to this "provider/state" fails
		// where the failed move leaves the space
		wantProv, wantState, wantAt string
		wantErr                     []string
	}{
		{name: "putting it to sleep", failSet: "none", wantAt: "none", wantErr: []string{"putting it to sleep", "served by this fleet"}},
		{name: "state handover refused", faults: map[string]fault{"PUT state": refused}, wantAt: "none",
			wantErr: []string{"handing its state over", "served by this fleet"}},
		{name: "state handover, answer lost", faults: map[string]fault{"PUT state": lost}, wantAt: "none",
			wantErr: []string{"handing its state over", "served by this fleet"}},
		{name: "hosting refused", faults: map[string]fault{"PUT space": refused}, wantAt: "none",
			wantErr: []string{"asking the provider to host it", "served by this fleet"}},
		{name: "hosting, answer lost", faults: map[string]fault{"PUT space": lost}, wantAt: "none",
			wantErr: []string{"asking the provider to host it", "served by this fleet"}},
		{name: "the route flip", failSet: partner + "/", wantAt: "none", wantErr: []string{"flipping its route", "served by this fleet"}},
		{name: "the route flip, and the provider's delete", failSet: partner + "/", faults: map[string]fault{"DELETE space": refused},
			wantAt: "held", wantErr: []string{"flipping its route", "served by this fleet", "held asleep"}},
		{name: "hosting lost, and the provider's delete", faults: map[string]fault{"PUT space": lost, "DELETE space": refused},
			wantAt: "held", wantErr: []string{"asking the provider to host it", "served by this fleet", "held asleep"}},
		{name: "the resume refused", faults: map[string]fault{"POST resume": refused}, wantAt: "none",
			wantErr: []string{"asking the provider to serve it", "served by this fleet"}},
		{name: "the resume lost", faults: map[string]fault{"POST resume": lost}, wantAt: "none",
			wantErr: []string{"asking the provider to serve it", "served by this fleet"}},
		// The provider may serve it (the resume's answer was lost) and did not delete
		// it: the route stays with the provider, so the fleet cannot serve it beside.
		{name: "the resume lost, and the provider's delete", faults: map[string]fault{"POST resume": lost, "DELETE space": refused},
			wantProv: partner, wantAt: "serving", wantErr: []string{"asking the provider to serve it", "delegate is run again"}},
		{name: "the resume refused, and the provider's delete", faults: map[string]fault{"POST resume": refused, "DELETE space": refused},
			wantProv: partner, wantAt: "held", wantErr: []string{"asking the provider to serve it", "neither side", "delegate is run again"}},
		// The route back first: its failure leaves the provider's route held.
		{name: "the route flip, and putting it back", failSet: partner + "/,/", wantProv: partner, wantState: registry.ProviderDelegating,
			wantAt: "held", wantErr: []string{"flipping its route", "neither side"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newMoveRig(t)
			r.p.setFaults(tc.faults)
			if tc.failSet != "" {
				fails := strings.Split(tc.failSet, ",")
				r.f.failSet = func(d string) error {
					for _, f := range fails {
						if d == f {
							return errors.New("registry unavailable")
						}
					}
					return nil
				}
				if tc.failSet == "none" {
					// A bucket the fleet cannot read the lease from.
					r.f.failSet = nil
					r.f.bkt.SetFail(func(_ context.Context, op membucket.Op, key string) error {
						if key == spacestore.LeaseKey(testHost) {
							return errors.New("bucket unavailable")
						}
						return nil
					})
				}
			}
			_, err, _ := r.delegate(t)
			if err == nil || !errors.Is(err, ErrMoveUpstream) {
				t.Fatalf("delegate: %v, want ErrMoveUpstream", err)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("delegate: %v, want it to say %q", err, want)
				}
			}
			r.check(t, "after the failure", tc.wantProv, tc.wantState, tc.wantAt, err)
			if w := wakeIn(t, r.p.h.bkt); !w.IsZero() && tc.faults["POST resume"] != lost {
				// Held (or never hosted), the space has no scheduled wake there.
				t.Fatalf("the provider, never asked to serve the space, recorded its wake at %v", w)
			}
			if tc.wantProv == "" && wakeIn(t, r.f.bkt).IsZero() {
				t.Fatal("the fleet serves the space again without its scheduled wake")
			}

			r.p.setFaults(nil)
			r.f.failSet = nil
			r.f.bkt.SetFail(nil)
			res, err, _ := r.delegate(t)
			if err != nil {
				t.Fatalf("delegate again: %v", err)
			}
			r.check(t, "delegated again", partner, "", "serving", nil)
			if g := generation(t, r.p.h.bkt); g != 3 {
				t.Fatalf("the provider has generation %d (res %+v), want 3", g, res)
			}
			if w := wakeIn(t, r.p.h.bkt); !w.Equal(fleetWake) {
				t.Fatalf("the provider's scheduled wake %v, want %v", w, fleetWake)
			}
		})
	}
}

// TestReclaimFailingAtEachStep: a reclaim that fails at any step (the provider's
// hibernate, its export, an export with a bad signature, the import into the fleet's
// bucket, the route flip) is undone: the provider serves the space again, with what it
// wrote, and the fleet does not; a failure that leaves it to neither side says so. A
// delete that fails after the flip is a success with a note, the provider's route held.
// Re-running the reclaim then completes it: the fleet serves the provider's state, with
// its next scheduled wake.
func TestReclaimFailingAtEachStep(t *testing.T) {
	for _, tc := range []struct {
		name    string
		faults  map[string]fault
		failSet string
		failPut bool // the fleet's bucket fails the import's writes
		// unreachable: nothing reaches the provider (its hibernate unsent): it is not
		// asked to resume what it never held
		unreachable bool
		imported    bool // the provider's state reached the fleet's bucket before the failure
		wantProv    string
		// wantState and wantAt: where the failed move leaves the space
		wantState, wantAt string
		wantErr           []string // empty: the move succeeds
		wantNote          string
	}{
		{name: "hibernate refused", faults: map[string]fault{"POST hibernate": refused}, wantProv: partner, wantAt: "serving",
			wantErr: []string{"putting it to sleep at the provider", "served by partner"}},
		{name: "the provider unreachable", unreachable: true, wantProv: partner, wantAt: "serving",
			wantErr: []string{"putting it to sleep at the provider", "served by partner, as before"}},
		{name: "hibernate lost", faults: map[string]fault{"POST hibernate": lost}, wantProv: partner, wantAt: "serving",
			wantErr: []string{"putting it to sleep at the provider", "served by partner"}},
		{name: "export refused", faults: map[string]fault{"GET export": refused}, wantProv: partner, wantAt: "serving",
			wantErr: []string{"taking its state back", "served by partner"}},
		{name: "an export with a bad signature", faults: map[string]fault{"GET export": badSignature}, wantProv: partner, wantAt: "serving",
			wantErr: []string{"taking its state back", "signature", "served by partner"}},
		{name: "the import", failPut: true, wantProv: partner, wantAt: "serving",
			wantErr: []string{"taking its state back", "served by partner"}},
		{name: "the route flip", failSet: "/", imported: true, wantProv: partner, wantAt: "serving",
			wantErr: []string{"flipping its route", "served by partner"}},
		{name: "the route flip, and the resume", failSet: "/", imported: true, faults: map[string]fault{"POST resume": refused},
			wantProv: partner, wantAt: "held", wantErr: []string{"flipping its route", "neither side"}},
		{name: "the export, and putting it back", failSet: partner + "/", faults: map[string]fault{"GET export": refused},
			wantProv: partner, wantState: registry.ProviderReclaiming, wantAt: "held", wantErr: []string{"taking its state back", "neither side"}},
		{name: "the delete", faults: map[string]fault{"DELETE space": refused}, imported: true, wantAt: "held", wantNote: "held asleep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newMoveRig(t)
			r.delegated(t)
			r.p.setFaults(tc.faults)
			if tc.failSet != "" {
				r.f.failSet = func(d string) error {
					if d == tc.failSet {
						return errors.New("registry unavailable")
					}
					return nil
				}
			}
			if tc.failPut {
				r.f.bkt.SetFail(func(_ context.Context, op membucket.Op, key string) error {
					if op == membucket.OpPut && key == spacestore.ManifestKey(testHost) {
						return errors.New("bucket unavailable")
					}
					return nil
				})
			}
			c := r.c
			if tc.unreachable {
				var err error
				if r.c, err = NewConn(&Provider{Name: partner, URL: "https://127.0.0.1:1", Token: keyA, AcceptToken: keyB,
					Domains: []string{"example.com"}}, ConnOptions{}, nil); err != nil {
					t.Fatal(err)
				}
			}
			res, err, _ := r.reclaim(t)
			r.c = c
			switch {
			case len(tc.wantErr) == 0 && err != nil:
				t.Fatalf("reclaim: %v", err)
			case len(tc.wantErr) > 0 && !errors.Is(err, ErrMoveUpstream):
				t.Fatalf("reclaim: %v, want ErrMoveUpstream", err)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("reclaim: %v, want it to say %q", err, want)
				}
			}
			if !strings.Contains(res.Note, tc.wantNote) {
				t.Fatalf("reclaim's note %q, want it to say %q", res.Note, tc.wantNote)
			}
			r.check(t, "after the failure", tc.wantProv, tc.wantState, tc.wantAt, err)
			if !tc.imported && generation(t, r.f.bkt) != 3 {
				t.Fatalf("the fleet's bucket has generation %d of a space the provider serves", generation(t, r.f.bkt))
			}

			r.p.setFaults(nil)
			r.f.failSet = nil
			r.f.bkt.SetFail(nil)
			if _, err, _ := r.reclaim(t); err != nil {
				t.Fatalf("reclaim again: %v", err)
			}
			if len(tc.wantErr) > 0 {
				r.check(t, "reclaimed again", "", "", "none", nil)
			}
			if g := generation(t, r.f.bkt); g != 5 {
				t.Fatalf("the fleet has generation %d, want the provider's 5", g)
			}
			if w := wakeIn(t, r.f.bkt); !w.Equal(provWake) {
				t.Fatalf("the fleet's scheduled wake %v, want the provider's %v", w, provWake)
			}
		})
	}
}

// TestMoveLeftByADeadBoxConverges: the box running a move dies at any step (nothing
// after it runs, no undo); neither side serves the space meanwhile, never both; running
// the move again (from another box) finishes it, and a reclaim of a delegation left
// half-way takes the space back.
func TestMoveLeftByADeadBoxConverges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reclaim bool   // the move that dies is a reclaim
		dieAt   string // dies at the fleet's SetDelegation to this, "before" or "after" storing it
		after   bool
		dieOn   string // or dies once the provider carried out this call
		// where the dead move leaves the space
		wantProv, wantState, wantAt string
	}{
		{name: "delegate, after the route left the fleet", dieAt: partner + "/" + registry.ProviderDelegating, after: true,
			wantProv: partner, wantState: registry.ProviderDelegating, wantAt: "none"},
		{name: "delegate, after the state was handed over", dieOn: "PUT state",
			wantProv: partner, wantState: registry.ProviderDelegating, wantAt: "none"},
		{name: "delegate, after the provider hosted it", dieOn: "PUT space",
			wantProv: partner, wantState: registry.ProviderDelegating, wantAt: "held"},
		{name: "delegate, after the route flip", dieAt: partner + "/", after: true,
			wantProv: partner, wantAt: "held"},
		{name: "reclaim, after the route started back", reclaim: true, dieAt: partner + "/" + registry.ProviderReclaiming, after: true,
			wantProv: partner, wantState: registry.ProviderReclaiming, wantAt: "serving"},
		{name: "reclaim, after the provider held it", reclaim: true, dieOn: "POST hibernate",
			wantProv: partner, wantState: registry.ProviderReclaiming, wantAt: "held"},
		{name: "reclaim, after the state came back", reclaim: true, dieOn: "GET export",
			wantProv: partner, wantState: registry.ProviderReclaiming, wantAt: "held"},
		{name: "reclaim, after the route flip", reclaim: true, dieAt: "/", after: true, wantAt: "held"},
	} {
		for _, rerun := range []string{"same", "reclaim"} {
			if tc.reclaim && rerun == "reclaim" {
				continue
			}
			t.Run(tc.name+", then "+rerun, func(t *testing.T) {
				r := newMoveRig(t)
				if tc.reclaim {
					r.delegated(t)
				}
				if tc.dieAt != "" {
					r.f.dieAt = func(d string) (bool, bool) {
						return d == tc.dieAt && !tc.after, d == tc.dieAt && tc.after
					}
				}
				r.p.senderDead = r.f.dead.Load
				r.p.done = func(call string) {
					if call == tc.dieOn {
						r.f.dead.Store(true)
					}
				}
				move := r.delegate
				if tc.reclaim {
					move = r.reclaim
				}
				if _, err, died := move(t); !died {
					t.Fatalf("the move ended (%v) before the box died", err)
				}
				// Left half-way, the space is served by neither side, or by one.
				prov, state := r.f.route(t)
				at := r.p.h.route()
				if prov != tc.wantProv || state != tc.wantState || at != tc.wantAt {
					t.Fatalf("left at fleet %q/%q, provider %s; want %q/%q, %s", prov, state, at, tc.wantProv, tc.wantState, tc.wantAt)
				}
				if prov == "" && at == "serving" {
					t.Fatal("both sides serve the space")
				}

				// Another box runs it again.
				r.f.dead.Store(false)
				r.f.dieAt, r.p.done = nil, nil
				again := move
				if rerun == "reclaim" {
					again = r.reclaim
				}
				if _, err, _ := again(t); err != nil {
					t.Fatalf("%s again: %v", rerun, err)
				}
				if tc.reclaim || rerun == "reclaim" {
					want := "none"
					if tc.reclaim && tc.dieAt == "/" {
						want = "held" // finished before it died, but its delete
					}
					r.check(t, "reclaimed", "", "", want, nil)
					wantGen := int64(3)
					if tc.reclaim {
						wantGen = 5
					}
					if g := generation(t, r.f.bkt); g != wantGen {
						t.Fatalf("the fleet has generation %d, want %d", g, wantGen)
					}
				} else {
					r.check(t, "delegated", partner, "", "serving", nil)
					if w := wakeIn(t, r.p.h.bkt); !w.Equal(fleetWake) {
						t.Fatalf("the provider's scheduled wake %v, want %v", w, fleetWake)
					}
				}
			})
		}
	}
}

// TestMovesSendNoFleetSecret: what a fleet sends its provider (every call's headers and
// body, the export included) carries none of its secrets: not its other spaces' env
// values, not the key it accepts exports with; the moved space's own env value is sent
// once, in the PUT of the space that delegates it, and never on the way back.
func TestMovesSendNoFleetSecret(t *testing.T) {
	r := newMoveRig(t)
	r.delegated(t)
	if _, err, _ := r.reclaim(t); err != nil {
		t.Fatal(err)
	}
	r.p.mu.Lock()
	reqs := r.p.reqs
	r.p.mu.Unlock()
	withEnv := 0
	for _, q := range reqs {
		raw := fmt.Sprintf("%v\n%s", q.header, q.body)
		for what, secret := range map[string]string{"another space's env value": otherSecret, "the accept token": string(keyB)} {
			if strings.Contains(raw, secret) {
				t.Errorf("%s carries %s", q.call, what)
			}
		}
		if strings.Contains(raw, spaceSecret) {
			withEnv++
			if q.call != "PUT space" {
				t.Errorf("%s carries the space's env value", q.call)
			}
		}
	}
	if withEnv != 1 {
		t.Errorf("the space's env value was sent %d times, want once (the delegation's PUT of the space)", withEnv)
	}
}

// TestDelegateAgainHandsOverWhatTheProviderLost: a delegation run again whose provider
// no longer hosts the space (an undo's delete went through, its operator removed it)
// hands it over again, and the provider serves what it saved, newer than the fleet's.
func TestDelegateAgainHandsOverWhatTheProviderLost(t *testing.T) {
	r := newMoveRig(t)
	r.delegated(t)
	if err := r.p.h.Remove(t.Context(), testHost); err != nil {
		t.Fatal(err)
	}
	res, err, _ := r.delegate(t)
	if err != nil || res.Already {
		t.Fatalf("delegate again: %+v %v, want the space handed over again", res, err)
	}
	r.check(t, "handed over again", partner, "", "serving", nil)
	if g := generation(t, r.p.h.bkt); g != 5 {
		t.Fatalf("the provider has generation %d, want its own 5", g)
	}
	if w := wakeIn(t, r.p.h.bkt); !w.Equal(provWake) {
		t.Fatalf("the provider's scheduled wake %v, want %v", w, provWake)
	}
}
