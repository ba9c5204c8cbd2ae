package registry

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

// FuzzValidateHost: an accepted host is a lowercase DNS name a registry key, a bucket key
// segment and a Host header can all carry: no path, port, wildcard, IP, empty or
// oversized label, and nothing outside a-z 0-9 - and '.'.
func FuzzValidateHost(f *testing.F) {
	for _, s := range []string{"a.example.com", "8oe.example.com", "xn--bcher-kva.example", "A.example.com", "a.example.com.",
		"a.example.com:443", "*.example.com", "127.0.0.1", "::1", "a/b", "..", "a..b", "-a.b", "a-.b", strings.Repeat("a", 64) + ".b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		if ValidateHost(h) != nil {
			return
		}
		if len(h) == 0 || len(h) > 253 || strings.ToLower(h) != h {
			t.Fatalf("accepted %q", h)
		}
		if _, err := netip.ParseAddr(h); err == nil {
			t.Fatalf("accepted IP %q", h)
		}
		for _, label := range strings.Split(h, ".") {
			if label == "" || len(label) > 63 || label == ".." {
				t.Fatalf("accepted %q with label %q", h, label)
			}
			for _, c := range label {
				if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
					t.Fatalf("accepted %q with %q", h, c)
				}
			}
		}
	})
}

// FuzzRouteValidate: a route decoded from any JSON body (what the admin API and the peer
// endpoint receive) is either refused or valid by every rule a box relies on before it
// stores the row.
func FuzzRouteValidate(f *testing.F) {
	for _, s := range []string{
		`{"host":"a.example.com","kind":"demo","hibernate":true}`,
		`{"host":"a.example.com","hibernate":false,"upstream":"127.0.0.1:9000"}`,
		`{"host":"a.example.com","hibernate":false,"lives_at":"https://box-b.example.net"}`,
		`{"host":"a.example.com","kind":"demo","hibernate":true,"env":{"ADMIN_TOKEN":"x","PATH":"/evil"}}`,
		`{"host":"a.example.com","kind":"demo","hibernate":true,"upstream":"x"}`,
		`{"host":"a.example.com","hibernate":false,"lives_at":"https://u:p@b/x"}`,
		`{"host":"A.EXAMPLE.COM","kind":"../../bin/sh","hibernate":true}`,
		`{}`, `null`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var rt Route
		if json.Unmarshal(data, &rt) != nil || rt.Validate() != nil {
			return
		}
		if ValidateHost(rt.Host) != nil {
			t.Fatalf("accepted host %q", rt.Host)
		}
		if rt.Hibernate && (rt.Kind == "" || rt.Upstream != "" || rt.LivesAt != "") {
			t.Fatalf("accepted hibernating route %+v", rt)
		}
		if !rt.Hibernate && (rt.Upstream == "") == (rt.LivesAt == "") {
			t.Fatalf("accepted live route %+v", rt)
		}
		if rt.Kind != "" && (!ValidKind(rt.Kind) || strings.ContainsAny(rt.Kind, "/\\")) {
			t.Fatalf("accepted kind %q", rt.Kind)
		}
		for k := range rt.Env {
			if ValidateEnvName(k) != nil || strings.ContainsAny(k, "=\x00") {
				t.Fatalf("accepted env name %q", k)
			}
		}
		// The summary (what status and list output show) must not depend on the env
		// values: the same route with every value blanked gives the same summary. (A
		// substring search for the values found false ones in the host's characters.)
		raw, _ := json.Marshal(rt.Summary())
		blank := rt
		blank.Env = make(map[string]string, len(rt.Env))
		for k := range rt.Env {
			blank.Env[k] = ""
		}
		if rawBlank, _ := json.Marshal(blank.Summary()); string(raw) != string(rawBlank) {
			t.Fatalf("summary carries env values: %s, with them blanked %s", raw, rawBlank)
		}
	})
}
