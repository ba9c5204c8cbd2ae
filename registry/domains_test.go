package registry

import (
	"slices"
	"strings"
	"testing"
)

func TestParseWildcardDomains(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    []string
		wantErr string
	}{
		{in: []string{"mesh.test,other.test"}, want: []string{"mesh.test", "other.test"}},
		{in: []string{" mesh.test  other.test\n"}, want: []string{"mesh.test", "other.test"}},
		{in: []string{"Mesh.Test., *.other.test", "mesh.test"}, want: []string{"mesh.test", "other.test"}},
		{in: []string{"a.b.example.com", "xn--bcher-kva.example"}, want: []string{"a.b.example.com", "xn--bcher-kva.example"}},
		{in: []string{"", " , "}, want: nil},
		{in: []string{"https://example.com"}, wantErr: `"https://example.com" is not a domain`},
		{in: []string{"example.com:443"}, wantErr: "letters, digits and hyphens"},
		{in: []string{"10.0.0.1"}, wantErr: "IP address"},
		{in: []string{"com"}, wantErr: "two labels"},
		{in: []string{"a..example.com"}, wantErr: "1 to 63"},
		{in: []string{"-a.example.com"}, wantErr: "hyphen"},
		{in: []string{"*.*.example.com"}, wantErr: "letters, digits and hyphens"},
		{in: []string{"bücher.example"}, wantErr: "letters, digits and hyphens"},
		{in: []string{strings.Repeat("a", 64) + ".com"}, wantErr: "1 to 63"},
	} {
		got, err := ParseWildcardDomains(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseWildcardDomains(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseWildcardDomains(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestWildcardNames(t *testing.T) {
	if got, want := WildcardNames([]string{"mesh.test", "other.test"}), []string{"*.mesh.test", "*.other.test"}; !slices.Equal(got, want) {
		t.Fatalf("WildcardNames = %q, want %q", got, want)
	}
	if got := WildcardNames(nil); len(got) != 0 {
		t.Fatalf("WildcardNames(nil) = %q", got)
	}
}
