package mesh

import (
	"bytes"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/registry"
)

// FuzzNormalizeHost: request-host normalisation. A Host header that normalizes to a
// host the registry accepts is stable under another normalisation, so the lookup key and
// every later comparison agree.
func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{"A.Example.COM", "a.example.com.", "a.example.com:8443", "[::1]:80", "::1", " a.b ", "a.b..", "a.b.:1", "", ":", "[", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		h := NormalizeHost(raw)
		if registry.ValidateHost(h) != nil {
			return
		}
		if again := NormalizeHost(h); again != h {
			t.Fatalf("NormalizeHost(%q) = %q, and again %q", raw, h, again)
		}
	})
}

// FuzzHostFromPath: a peer request path yields either nothing or a host the registry
// accepts as a key.
func FuzzHostFromPath(f *testing.F) {
	for _, s := range []string{PathRoute + "a.example.com", PathRoute + "A.EXAMPLE.COM.", PathRoute + "a%2Fb", PathRoute + "..", PathRoute + "10.0.0.1", PathRoute + "a.b/c", "/other/a.b", PathRoute} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		h, ok := HostFromPath(p)
		if ok && registry.ValidateHost(h) != nil {
			t.Fatalf("HostFromPath(%q) accepted %q, which the registry refuses: %v", p, h, registry.ValidateHost(h))
		}
	})
}

// FuzzDecodeRow: replication row decoding and validation. An accepted row passes its
// own validation again unchanged, makes a route the registry accepts, and carries no
// loader or shell variable.
func FuzzDecodeRow(f *testing.F) {
	for _, s := range []string{
		`{"host":"a.example.com","kind":"demo","hibernate":true}`,
		`{"host":"a.example.com","kind":"demo","hibernate":true,"home_region":"eu","env":{"ADMIN_TOKEN":"x"}}`,
		`{"host":"a.example.com","kind":"demo","hibernate":false,"lives_at":"https://box-b.example.net"}`,
		`{"host":"10.0.0.1","kind":"demo","hibernate":true}`,
		`{"host":"a.example.com","kind":"demo","hibernate":true,"env":{"LD_PRELOAD":"x"}}`,
		`{"host":"a.example.com","kind":"demo","hibernate":false,"lives_at":"http://169.254.169.254/latest"}`,
		`{"host":"a.example.com","kind":"demo","hibernate":true}{"x":1}`, `{}`, `null`,
	} {
		f.Add([]byte(s), "a.example.com")
	}
	f.Fuzz(func(t *testing.T, body []byte, pathHost string) {
		req := httptest.NewRequest("PUT", "http://box"+PathRoute+"x", bytes.NewReader(body))
		req.URL.Path = PathRoute + pathHost
		row, err := DecodeRow(req, 0)
		if err != nil {
			return
		}
		again := row
		if err := again.Validate(); err != nil || again.Host != row.Host || again.LivesAt != row.LivesAt {
			t.Fatalf("accepted row %v does not validate again: %v", row, err)
		}
		rt := RouteFromRow(row)
		if err := rt.Validate(); err != nil {
			t.Fatalf("accepted row %v makes a route the registry refuses: %v", row, err)
		}
		for k := range row.Env {
			if registry.ForbiddenEnv(k) {
				t.Fatalf("accepted row %v carries %s", row, k)
			}
		}
	})
}

// FuzzMarkerVerify: forwarded-marker verification. No value verifies for a host unless it
// is exactly what Sign makes for that host at its own time.
func FuzzMarkerVerify(f *testing.F) {
	m := Marker{Token: "fuzz-token", Now: func() time.Time { return time.Unix(1_800_000_000, 0) }}
	f.Add(m.Sign("a.example.com", m.Now()), "a.example.com")
	f.Add(m.Sign("a.example.com", m.Now()), "b.example.com")
	f.Add("1800000000."+strings.Repeat("0", 64), "a.example.com")
	f.Add("-1.x", "a")
	f.Add("01800000000."+strings.Repeat("a", 64), "a.example.com")
	f.Add(strings.ToUpper(m.Sign("a.example.com", m.Now())), "A.eXAmple.Com") // CI: uppercase hex was accepted
	f.Fuzz(func(t *testing.T, value, host string) {
		if m.Verify(value, host) != nil {
			return
		}
		ts, _, _ := strings.Cut(strings.TrimSpace(value), ".")
		sec, _ := strconv.ParseInt(ts, 10, 64)
		if want := m.Sign(host, time.Unix(sec, 0)); strings.TrimSpace(value) != want {
			t.Fatalf("Verify accepted %q for %q; Sign makes %q", value, host, want)
		}
	})
}

// FuzzDecodeHeartbeat: whatever a heartbeat object holds, decoding it never panics and
// an accepted heartbeat only names valid domains, region, incarnation and address.
func FuzzDecodeHeartbeat(f *testing.F) {
	for _, s := range []string{
		`{"region":"eu","domains":["example.com"],"incarnation":"abc123","version":"v1"}`,
		`{"region":"","domains":[],"incarnation":"x","draining":true,"address":"192.0.2.1","bucket":"s3://b/p"}`,
		`{"region":"../x","domains":["*.example.com"],"incarnation":""}`,
		`{"domains":["EXAMPLE.COM."],"incarnation":"x"}`, `null`, `[]`, `{"incarnation":"` + strings.Repeat("x", 300) + `"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		hb, err := DecodeHeartbeat(raw)
		if err != nil {
			return
		}
		if hb.Region != "" && registry.ValidateRegion(hb.Region) != nil {
			t.Fatalf("accepted region %q", hb.Region)
		}
		for _, d := range hb.Domains {
			if !validHostname(d) {
				t.Fatalf("accepted domain %q", d)
			}
		}
		if hb.Incarnation == "" || len(hb.Incarnation) > maxShortField {
			t.Fatalf("accepted incarnation %q", hb.Incarnation)
		}
	})
}

// FuzzSelfFromKey: a heartbeat key decodes to a SELF only if that SELF is canonical and
// encodes back to the same key.
func FuzzSelfFromKey(f *testing.F) {
	for _, s := range []string{HeartbeatKey("https://box-a.example.net"), HeartbeatKey("http://127.0.0.2:8080"), MembersPrefix + "!!!", "aHR0cHM6Ly9B", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		self, ok := SelfFromKey(key)
		if !ok {
			return
		}
		if p, err := ParseSelf(self); err != nil || p != self {
			t.Fatalf("SelfFromKey(%q) = %q, not canonical (%q, %v)", key, self, p, err)
		}
		if got := HeartbeatKey(self); got != MembersPrefix+strings.TrimPrefix(key, MembersPrefix) {
			t.Fatalf("SelfFromKey(%q) = %q, whose key is %q", key, self, got)
		}
	})
}

// FuzzParseSelfAndDomains: the mesh's identity and scope settings are canonical once
// parsed.
func FuzzParseSelfAndDomains(f *testing.F) {
	for _, s := range []string{"https://Box-A.example.net:443/", "http://[::1]:80", "https://u:p@b", "https://b/x", "example.com, EXAMPLE.net.", "*.example.com", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if self, err := ParseSelf(raw); err == nil {
			if again, err := ParseSelf(self); err != nil || again != self {
				t.Fatalf("ParseSelf(%q) = %q, again %q %v", raw, self, again, err)
			}
		}
		if ds, err := ParseDomains(raw); err == nil {
			for _, d := range ds {
				if !validHostname(d) {
					t.Fatalf("ParseDomains(%q) accepted %q", raw, d)
				}
			}
		}
	})
}
