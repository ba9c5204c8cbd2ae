package mesh

import (
	"strings"
	"testing"
)

func TestInsecureSelf(t *testing.T) {
	for self, want := range map[string]bool{
		"https://box-1.example.net": false,
		"http://box-1.example.net":  true,
		"http://203.0.113.9:8080":   true,
		"http://10.0.0.5":           false,
		"http://172.16.3.4:8080":    false,
		"http://192.168.1.2":        false,
		"http://[fd00::5]:80":       false,
		"http://127.0.0.2:8080":     false,
		"http://localhost:8080":     false,
		"http://[::1]:8080":         false,
		"http://[2001:db8::1]:80":   true,
	} {
		if got := InsecureSelf(self); got != want {
			t.Errorf("InsecureSelf(%q) = %v, want %v", self, got, want)
		}
	}
}

func TestCheckConfig(t *testing.T) {
	for _, tc := range []struct {
		name         string
		facts        ConfigFacts
		refuse, warn string // substrings; "" for none
	}{
		{"consistent", ConfigFacts{Self: "https://b1.example.net", Domains: []string{"example.com"}, Wildcards: []string{"example.com"}, RelocateZone: "example.com"}, "", ""},
		{"no wildcards managed", ConfigFacts{Self: "https://b1.example.net", Domains: []string{"example.com"}}, "", ""},
		{"uncovered, https", ConfigFacts{Self: "https://b1.example.net", Domains: []string{"example.com", "example.org"}, Wildcards: []string{"example.com"}}, "example.org are not among", ""},
		{"uncovered, private http", ConfigFacts{Self: "http://10.0.0.5", Domains: []string{"example.org"}, Wildcards: []string{"example.com"}}, "", "harmless while SELF is plain http"},
		{"public http", ConfigFacts{Self: "http://203.0.113.9", Domains: []string{"example.com"}}, "", "not private"},
		{"zone holds none", ConfigFacts{Self: "https://b", Domains: []string{"example.com"}, RelocateZone: "example.net"}, "contains none of the mesh domains", ""},
		{"zone holds some", ConfigFacts{Self: "https://b", Domains: []string{"spaces.example.com", "example.org"}, RelocateZone: "example.com"}, "", "does not contain the mesh domains example.org"},
	} {
		p := CheckConfig(tc.facts)
		check := func(kind string, got []string, want string) {
			if want == "" {
				if len(got) > 0 {
					t.Errorf("%s: unexpected %s %q", tc.name, kind, got)
				}
				return
			}
			if len(got) != 1 || !strings.Contains(got[0], want) {
				t.Errorf("%s: %s = %q, want one containing %q", tc.name, kind, got, want)
			}
		}
		check("refusal", p.Refuse, tc.refuse)
		check("warning", p.Warn, tc.warn)
	}
	if !InZone("8oe.Example.com.", "example.com") || InZone("badexample.com", "example.com") {
		t.Error("InZone")
	}
}
