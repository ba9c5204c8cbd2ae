package dnsimple

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/libdns/libdns"
)

const (
	testToken = "dnsimple-token-never-in-output"
	accountID = 1010
	zoneNum   = 77
)

type record struct {
	ID           int64  `json:"id"`
	ZoneID       string `json:"zone_id"`
	ParentID     *int64 `json:"parent_id"`
	Name         string `json:"name"`
	Content      string `json:"content"`
	TTL          int    `json:"ttl"`
	Priority     *int   `json:"priority"`
	Type         string `json:"type"`
	SystemRecord bool   `json:"system_record"`
	CreatedAt    string `json:"created_at"`
	UpdatedAt    string `json:"updated_at"`
}

// fakeDNSimple replays the DNSimple API v2 (developer.dnsimple.com/v2) for one
// account holding the zone example.com: whoami, zone lookup, record list (with the
// name_like and type filters), create, update and delete, and its error documents.
type fakeDNSimple struct {
	t *testing.T

	mu       sync.Mutex
	records  map[int64]*record
	nextID   int64
	requests []string
	whoamis  int
}

func newFake(t *testing.T) (*fakeDNSimple, *httptest.Server) {
	f := &fakeDNSimple{t: t, records: map[int64]*record{}, nextID: 100}
	f.records[1] = &record{ID: 1, ZoneID: "example.com", Type: "SOA", Content: "ns1.dnsimple.com admin.dnsimple.com 1 86400 7200 604800 300", TTL: 3600, SystemRecord: true}
	f.records[2] = &record{ID: 2, ZoneID: "example.com", Type: "NS", Content: "ns1.dnsimple.com", TTL: 3600, SystemRecord: true}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeDNSimple) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	if r.Header.Get("Authorization") != "Bearer "+testToken {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"message": "Authentication failed"})
		return
	}
	if r.Header.Get("Accept") != "application/json" {
		f.t.Errorf("%s %s: Accept %q, want application/json", r.Method, r.URL.Path, r.Header.Get("Accept"))
	}
	if r.URL.Path == "/v2/whoami" {
		f.whoamis++
		writeJSON(w, http.StatusOK, map[string]any{"data": map[string]any{"user": nil, "account": map[string]any{
			"id": accountID, "email": "ops@example.com", "plan_identifier": "teams-v1-monthly",
			"created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}}})
		return
	}
	prefix := fmt.Sprintf("/v2/%d/zones/", accountID)
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"message": "Account not found"})
		return
	}
	parts := strings.Split(rest, "/")
	if parts[0] != "example.com" && parts[0] != strconv.Itoa(zoneNum) {
		writeJSON(w, http.StatusNotFound, map[string]string{"message": fmt.Sprintf("Zone `%s` not found", parts[0])})
		return
	}
	switch {
	case len(parts) == 1 && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"data": map[string]any{"id": zoneNum, "account_id": accountID,
			"name": "example.com", "reverse": false, "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}})
	case len(parts) == 2 && parts[1] == "records" && r.Method == http.MethodGet:
		q := r.URL.Query()
		var out []*record
		for id := int64(0); id <= f.nextID; id++ {
			rec, ok := f.records[id]
			if !ok {
				continue
			}
			if q.Has("name") && rec.Name != q.Get("name") {
				continue
			}
			if nl := q.Get("name_like"); nl != "" && !strings.Contains(rec.Name, nl) {
				continue
			}
			if ty := q.Get("type"); ty != "" && rec.Type != ty {
				continue
			}
			out = append(out, rec)
		}
		// Pages of 30, as the API's default.
		const perPage = 30
		page, _ := strconv.Atoi(q.Get("page"))
		page = max(page, 1)
		total := len(out)
		pages := max((total+perPage-1)/perPage, 1)
		lo, hi := min((page-1)*perPage, total), min(page*perPage, total)
		writeJSON(w, http.StatusOK, map[string]any{"data": out[lo:hi], "pagination": map[string]int{
			"current_page": page, "per_page": perPage, "total_entries": total, "total_pages": pages}})
	case len(parts) == 2 && parts[1] == "records" && r.Method == http.MethodPost:
		var attrs struct {
			Name    *string `json:"name"`
			Type    string  `json:"type"`
			Content string  `json:"content"`
			TTL     int     `json:"ttl"`
		}
		if err := json.NewDecoder(r.Body).Decode(&attrs); err != nil || attrs.Name == nil || attrs.Type == "" || attrs.Content == "" {
			writeJSON(w, http.StatusBadRequest, map[string]any{"message": "Validation failed",
				"errors": map[string][]string{"content": {"can't be blank"}}})
			return
		}
		f.nextID++
		rec := &record{ID: f.nextID, ZoneID: "example.com", Name: *attrs.Name, Type: attrs.Type, Content: attrs.Content, TTL: attrs.TTL}
		f.records[rec.ID] = rec
		writeJSON(w, http.StatusCreated, map[string]any{"data": rec})
	case len(parts) == 3 && parts[1] == "records":
		id, _ := strconv.ParseInt(parts[2], 10, 64)
		rec, ok := f.records[id]
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"message": fmt.Sprintf("Record `%s` not found", parts[2])})
			return
		}
		switch r.Method {
		case http.MethodDelete:
			delete(f.records, id)
			w.WriteHeader(http.StatusNoContent)
		case http.MethodPatch:
			var attrs struct {
				Content string `json:"content"`
				TTL     int    `json:"ttl"`
			}
			_ = json.NewDecoder(r.Body).Decode(&attrs)
			if attrs.Content != "" {
				rec.Content = attrs.Content
			}
			if attrs.TTL != 0 {
				rec.TTL = attrs.TTL
			}
			writeJSON(w, http.StatusOK, map[string]any{"data": rec})
		default:
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"message": "method not allowed"})
		}
	default:
		f.t.Errorf("unexpected request %s %s", r.Method, r.URL)
		w.WriteHeader(http.StatusNotImplemented)
	}
}

func (f *fakeDNSimple) find(name, typ string) []*record {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*record
	for _, r := range f.records {
		if r.Name == name && r.Type == typ {
			out = append(out, r)
		}
	}
	return out
}

func provisioned(t *testing.T, p *Provider) *Provider {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := p.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return p
}

func TestDNS01TXTAppendAndDelete(t *testing.T) {
	for _, tc := range []struct {
		name        string
		account     string
		wantWhoamis int
	}{
		{"account from whoami", "", 1},
		{"account configured", strconv.Itoa(accountID), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFake(t)
			p := provisioned(t, &Provider{APIAccessToken: testToken, AccountID: tc.account, APIURL: srv.URL + "/"})
			ctx := context.Background()
			txt := libdns.TXT{Name: "_acme-challenge", Text: "token-value-1", TTL: 60 * time.Second}
			other := libdns.TXT{Name: "_acme-challenge", Text: "token-value-2", TTL: 60 * time.Second}

			for _, rec := range []libdns.Record{txt, other} {
				out, err := p.AppendRecords(ctx, "example.com.", []libdns.Record{rec})
				if err != nil {
					t.Fatalf("append: %v", err)
				}
				if len(out) != 1 {
					t.Fatalf("append returned %d records, want 1", len(out))
				}
			}
			got := f.find("_acme-challenge", "TXT")
			if len(got) != 2 || got[0].TTL != 60 {
				t.Fatalf("after two appends the zone holds %d TXT records (want 2, appended not replaced)", len(got))
			}
			if f.whoamis != tc.wantWhoamis {
				t.Errorf("whoami asked %d times, want %d (the account is resolved once)", f.whoamis, tc.wantWhoamis)
			}
			f.mu.Lock()
			reqs := append([]string(nil), f.requests...)
			f.mu.Unlock()
			wantCreate := fmt.Sprintf("POST /v2/%d/zones/example.com/records", accountID)
			if !contains(reqs, wantCreate) || !contains(reqs, fmt.Sprintf("GET /v2/%d/zones/example.com", accountID)) {
				t.Errorf("requests %v lack the zone lookup and %q (zone name without the trailing dot)", reqs, wantCreate)
			}

			// Delete the later value first: the earlier one, still needed by a
			// pending validation of the same name, must stay.
			if _, err := p.DeleteRecords(ctx, "example.com.", []libdns.Record{other}); err != nil {
				t.Fatalf("delete: %v", err)
			}
			if got := f.find("_acme-challenge", "TXT"); len(got) != 1 || got[0].Content != "token-value-1" {
				t.Fatalf("after deleting token-value-2 the zone holds %+v, want only token-value-1", got)
			}
			if _, err := p.DeleteRecords(ctx, "example.com.", []libdns.Record{txt}); err != nil {
				t.Fatalf("delete: %v", err)
			}
			if got := f.find("_acme-challenge", "TXT"); len(got) != 0 {
				t.Fatalf("%d TXT records remain after deleting both", len(got))
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestARecordSetForRelocation(t *testing.T) {
	f, srv := newFake(t)
	p := provisioned(t, &Provider{APIAccessToken: testToken, AccountID: strconv.Itoa(accountID), APIURL: srv.URL})
	ctx := context.Background()
	// A neighbour whose name contains the moved host's name must stay untouched.
	f.mu.Lock()
	f.records[50] = &record{ID: 50, ZoneID: "example.com", Name: "x8oe", Type: "A", Content: "203.0.113.5", TTL: 300}
	f.mu.Unlock()
	for _, ip := range []string{"192.0.2.10", "198.51.100.7"} {
		a, err := libdns.RR{Name: "8oe", Type: "A", Data: ip, TTL: 300 * time.Second}.Parse()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.SetRecords(ctx, "example.com.", []libdns.Record{a}); err != nil {
			t.Fatalf("set A %s: %v", ip, err)
		}
	}
	got := f.find("8oe", "A")
	if len(got) != 1 || got[0].Content != "198.51.100.7" {
		t.Fatalf("A records for 8oe = %+v, want exactly one with the new address", got)
	}
	f.mu.Lock()
	patched := contains(f.requests, fmt.Sprintf("PATCH /v2/%d/zones/example.com/records/%d", accountID, got[0].ID))
	f.mu.Unlock()
	if !patched {
		t.Error("the move did not update the existing record in place")
	}
	if n := f.find("x8oe", "A"); len(n) != 1 || n[0].Content != "203.0.113.5" {
		t.Errorf("the neighbour x8oe was changed: %+v", n)
	}
}

func TestErrorsAreReportedWithoutSecrets(t *testing.T) {
	_, srv := newFake(t)
	txt := libdns.TXT{Name: "_acme-challenge", Text: "v"}
	for _, tc := range []struct {
		name, token, account, zone, want string
	}{
		{"bad token at whoami", "wrong-" + testToken, "", "example.com.", "401"},
		{"bad token", "wrong-" + testToken, strconv.Itoa(accountID), "example.com.", "Authentication failed"},
		{"unknown zone", testToken, strconv.Itoa(accountID), "example.org.", "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := provisioned(t, &Provider{APIAccessToken: tc.token, AccountID: tc.account, APIURL: srv.URL})
			_, err := p.AppendRecords(context.Background(), tc.zone, []libdns.Record{txt})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if strings.Contains(err.Error(), testToken) {
				t.Fatal("error text carries the token")
			}
		})
	}

	// An unreachable API is an error, not a crash (the libdns provider alone
	// dereferences the nil whoami response).
	p := provisioned(t, &Provider{APIAccessToken: testToken, APIURL: "http://127.0.0.1:1"})
	if _, err := p.AppendRecords(context.Background(), "example.com.", []libdns.Record{txt}); err == nil {
		t.Fatal("append against an unreachable API succeeded")
	}
}

func TestScrubRemovesToken(t *testing.T) {
	p := &Provider{APIAccessToken: testToken}
	if err := p.scrub(fmt.Errorf("sending Bearer %s failed", testToken)); strings.Contains(err.Error(), testToken) {
		t.Fatalf("scrub left the token: %v", err)
	}
}

func TestProvision(t *testing.T) {
	t.Setenv("LCHAT_TEST_DNSIMPLE_TOKEN", testToken+"\n")
	p := provisioned(t, &Provider{APIAccessToken: "{env.LCHAT_TEST_DNSIMPLE_TOKEN}", APIURL: "https://api.sandbox.dnsimple.com/"})
	if p.APIAccessToken != testToken || p.APIURL != "https://api.sandbox.dnsimple.com" {
		t.Fatalf("after provision: token expanded=%v url %q", p.APIAccessToken == testToken, p.APIURL)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, bad := range []*Provider{{}, {APIAccessToken: "{env.LCHAT_TEST_UNSET_VAR}"}, {APIAccessToken: "t", AccountID: "acme"}} {
		err := bad.Provision(ctx)
		if err == nil {
			t.Errorf("provision accepted %+v", bad)
		}
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input   string
		want    Provider
		wantErr string
	}{
		{input: `dnsimple {env.DNSIMPLE_API_TOKEN}`, want: Provider{APIAccessToken: "{env.DNSIMPLE_API_TOKEN}"}},
		{input: "dnsimple {\n api_access_token T\n account_id 1010\n api_url https://api.sandbox.dnsimple.com\n}",
			want: Provider{APIAccessToken: "T", AccountID: "1010", APIURL: "https://api.sandbox.dnsimple.com"}},
		{input: "dnsimple T {\n account_id 1010\n}", want: Provider{APIAccessToken: "T", AccountID: "1010"}},
		{input: `dnsimple a b`, wantErr: "wrong argument count"},
		{input: "dnsimple {\n account_id\n}", wantErr: "wrong argument count"},
		{input: "dnsimple {\n api_url a b\n}", wantErr: "wrong argument count"},
		{input: "dnsimple {\n token x\n}", wantErr: "unrecognized subdirective token"},
	} {
		var p Provider
		err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want %q", tc.input, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.input, err)
			continue
		}
		if p.APIAccessToken != tc.want.APIAccessToken || p.AccountID != tc.want.AccountID || p.APIURL != tc.want.APIURL {
			t.Errorf("%q: got %+v, want %+v", tc.input, p, tc.want)
		}
	}
}

// Listing follows every page, and a challenge value on a later page is still the
// one deleted.
func TestPagination(t *testing.T) {
	f, srv := newFake(t)
	p := provisioned(t, &Provider{APIAccessToken: testToken, AccountID: strconv.Itoa(accountID), APIURL: srv.URL})
	ctx := context.Background()
	f.mu.Lock()
	for i := range 70 {
		f.nextID++
		f.records[f.nextID] = &record{ID: f.nextID, ZoneID: "example.com", Name: fmt.Sprintf("s%02d", i), Type: "A", Content: "192.0.2.1", TTL: 300}
	}
	for i := range 35 {
		f.nextID++
		f.records[f.nextID] = &record{ID: f.nextID, ZoneID: "example.com", Name: "_acme-challenge", Type: "TXT", Content: fmt.Sprintf("other-%02d", i), TTL: 60}
	}
	f.mu.Unlock()
	mine := libdns.TXT{Name: "_acme-challenge", Text: "mine", TTL: time.Minute}
	if _, err := p.AppendRecords(ctx, "example.com.", []libdns.Record{mine}); err != nil {
		t.Fatal(err)
	}
	recs, err := p.GetRecords(ctx, "example.com.")
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 + 70 + 35 + 1; len(recs) != want {
		t.Fatalf("GetRecords returned %d records, want all %d (every page)", len(recs), want)
	}
	for _, r := range recs {
		if r == nil {
			t.Fatal("GetRecords returned a nil record")
		}
	}
	if _, err := p.DeleteRecords(ctx, "example.com.", []libdns.Record{mine}); err != nil {
		t.Fatal(err)
	}
	got := f.find("_acme-challenge", "TXT")
	if len(got) != 35 {
		t.Fatalf("%d TXT records left, want the 35 others", len(got))
	}
	for _, r := range got {
		if r.Content == "mine" {
			t.Fatal("the value on the second page was not deleted")
		}
	}
}

// A call against an API that never answers ends at the provider's deadline with
// an error, instead of holding certmagic's issuance lock forever.
func TestHungAPICallEnds(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	p := provisioned(t, &Provider{APIAccessToken: testToken, AccountID: strconv.Itoa(accountID), APIURL: srv.URL})
	p.timeout = 100 * time.Millisecond
	done := make(chan error, 1)
	go func() {
		_, err := p.AppendRecords(context.Background(), "example.com.", []libdns.Record{libdns.TXT{Name: "_acme-challenge", Text: "v"}})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("append against a hung API succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("append against a hung API did not return")
	}
}
