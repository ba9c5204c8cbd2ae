package testdns

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/libdns/libdns"
)

// A delete of one TXT value keeps the other values of the same name, although
// challtestsrv can only clear a name entirely.
func TestDeleteKeepsOtherValues(t *testing.T) {
	var mu sync.Mutex
	txt := map[string][]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Host, Value string }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/set-txt":
			txt[req.Host] = append(txt[req.Host], req.Value)
		case "/clear-txt":
			delete(txt, req.Host)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	p := &Provider{ManagementURL: srv.URL + "/"}
	if err := p.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	one := libdns.TXT{Name: "_acme-challenge", Text: "one"}
	two := libdns.TXT{Name: "_acme-challenge", Text: "two"}
	if _, err := p.AppendRecords(ctx, "mesh.test.", []libdns.Record{one, two}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DeleteRecords(ctx, "mesh.test.", []libdns.Record{one}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := txt["_acme-challenge.mesh.test."]
	mu.Unlock()
	if !slices.Equal(got, []string{"two"}) {
		t.Fatalf("TXT values after deleting one = %v, want [two]", got)
	}
	if _, err := p.AppendRecords(ctx, "mesh.test.", []libdns.Record{libdns.RR{Name: "x", Type: "MX", Data: "1 mx"}}); err == nil {
		t.Fatal("an unsupported record type was accepted")
	}
}
