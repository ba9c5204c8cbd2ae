package console

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/modules/lchat"
)

// The lchat app is what the console reads the seam from.
var _ ProviderSource = (*lchat.App)(nil)

// fixedSeam is the seam's document as the lchat app builds it for GET /lchat/providers:
// a.example.com delegated to a provider this box last failed to reach, while it is being
// reclaimed; a second provider nothing was asked of yet; b.example.com hosted here for
// another fleet.
type fixedSeam struct{ doc *adminapi.Providers }

func (f fixedSeam) ProviderStatus() *adminapi.Providers { return f.doc }

func seamDoc() *adminapi.Providers {
	return &adminapi.Providers{
		Providers: []adminapi.ProviderStatus{{Name: "partner", URL: "https://provider.example.net", Domains: []string{"example.com"},
			MaxSpaces: 10, Health: "failing", Healthy: false, Requests: 41, Errors: 3, LastError: "dial tcp 192.0.2.7:443: connection refused",
			Spaces: []adminapi.DelegatedSpace{{Host: "a.example.com", State: "reclaiming"}}},
			{Name: "newcomer", URL: "https://new.example.net", Domains: []string{"example.com"}, Health: "unknown", Spaces: []adminapi.DelegatedSpace{}}},
		Clients: []adminapi.ClientStatus{{Name: "fleet-a", Domains: []string{"example.com"}, Spaces: []string{"b.example.com"}}},
	}
}

// TestDelegatedSpacesShowTheirProvider: a delegated space shows, in the spaces table, on
// its page and in /api/spaces, its provider, where it stands with it and the provider's
// health as this box knows it; a space hosted here names the fleet it is hosted for; the
// index lists the providers and client fleets. A config without the seam shows none of it.
func TestDelegatedSpacesShowTheirProvider(t *testing.T) {
	h := newHandler(&fakeSource{}, nil)
	h.prov = fixedSeam{seamDoc()}

	index := serve(h, httptest.NewRequest("GET", "/", nil))
	body := index.Body.String()
	for _, want := range []string{
		`<td class="state"><span class="tag">delegated</span> to <span title="https://provider.example.net">partner</span> <span class="warn">reclaiming</span>: <span class="bad" title="dial tcp 192.0.2.7:443: connection refused">provider failing</span></td>`,
		`<span class="st st-awake">awake</span> <span class="tag">hosted for fleet-a</span></td>`,
		`<a href="./#providers">Providers</a>`,
		`<td class="health"><span class="bad">failing</span> <small>dial tcp 192.0.2.7:443: connection refused</small></td>`,
		`<td class="health"><span class="warn" title="no request to it has finished on this box yet">unknown</span></td>`,
		`<td>41</td>`,
		`<td class="delegated">1 of 10 <small>(<a href="./space/a.example.com">a.example.com</a> reclaiming)</small></td>`,
		`<td class="hosted">1 <small>(b.example.com)</small></td>`,
	} {
		if index.Code != 200 || !strings.Contains(body, want) {
			t.Errorf("index: %d, want %s", index.Code, want)
		}
	}
	if t.Failed() {
		t.Fatalf("index:\n%s", body)
	}
	if w := serve(h, httptest.NewRequest("GET", "/fragment/providers", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), `<tr data-provider="partner">`) {
		t.Fatalf("providers fragment: %d\n%s", w.Code, w.Body.String())
	}

	page := serve(h, httptest.NewRequest("GET", "/space/a.example.com", nil))
	const dd = `<dt>Provider</dt><dd class="provider"><span class="tag">delegated</span> to <span title="https://provider.example.net">partner</span> <span class="warn">reclaiming</span>: <span class="bad" title="dial tcp 192.0.2.7:443: connection refused">provider failing</span> <small>(dial tcp 192.0.2.7:443: connection refused)</small>; every box of this fleet forwards its requests there</dd>`
	if page.Code != 200 || !strings.Contains(page.Body.String(), dd) {
		t.Fatalf("space page: %d, want %s\n%s", page.Code, dd, page.Body.String())
	}
	if w := serve(h, httptest.NewRequest("GET", "/space/b.example.com", nil)); w.Code != 200 ||
		!strings.Contains(w.Body.String(), `<dt>Hosted for</dt><dd class="hosted-for">fleet-a: this fleet serves it as their provider</dd>`) {
		t.Fatalf("hosted space's page: %d\n%s", w.Code, w.Body.String())
	}

	var spaces []map[string]json.RawMessage
	w := serve(h, httptest.NewRequest("GET", "/api/spaces", nil))
	if err := json.Unmarshal(w.Body.Bytes(), &spaces); err != nil || len(spaces) != 2 {
		t.Fatalf("/api/spaces: %d %v\n%s", w.Code, err, w.Body.String())
	}
	const prov = `{"name":"partner","url":"https://provider.example.net","state":"reclaiming","health":"failing","healthy":false,"last_error":"dial tcp 192.0.2.7:443: connection refused"}`
	if got := string(spaces[0]["provider"]); got != prov || string(spaces[0]["host"]) != `"a.example.com"` {
		t.Errorf("/api/spaces a.example.com: provider %s, want %s", got, prov)
	}
	if got := string(spaces[1]["hosted_for"]); got != `"fleet-a"` || spaces[1]["provider"] != nil {
		t.Errorf("/api/spaces b.example.com: %s", w.Body.String())
	}
	w = serve(h, httptest.NewRequest("GET", "/api/providers", nil))
	want, _ := json.Marshal(seamDoc())
	if w.Code != 200 || strings.TrimSpace(w.Body.String()) != string(want) {
		t.Errorf("/api/providers: %d %s, want %s", w.Code, w.Body.String(), want)
	}

	// No seam in the config: the console looks as it always did.
	for name, src := range map[string]ProviderSource{"no source": nil, "no providers": fixedSeam{nil}} {
		h := newHandler(&fakeSource{}, nil)
		h.prov = src
		body := serve(h, httptest.NewRequest("GET", "/", nil)).Body.String()
		if strings.Contains(body, `id="providers"`) || strings.Contains(body, "delegated") || strings.Contains(body, "hosted for") {
			t.Errorf("%s: the index shows the seam:\n%s", name, body)
		}
		if w := serve(h, httptest.NewRequest("GET", "/api/spaces", nil)); strings.Contains(w.Body.String(), `"provider"`) || strings.Contains(w.Body.String(), `"hosted_for"`) {
			t.Errorf("%s: /api/spaces: %s", name, w.Body.String())
		}
		if w := serve(h, httptest.NewRequest("GET", "/api/providers", nil)); strings.TrimSpace(w.Body.String()) != `{"providers":[],"clients":[]}` {
			t.Errorf("%s: /api/providers: %s", name, w.Body.String())
		}
	}
}
