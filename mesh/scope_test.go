package mesh

import "testing"

// TestNormalizeHost: a Host header, a registry key and a peer's path that name the same
// host normalize to the same string, IPv6 with or without a port included, and what is
// not host[:port] normalizes to "" (no route) rather than to a near miss of a real host.
func TestNormalizeHost(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// Names.
		{"example.com", "example.com"},
		{"Example.COM.", "example.com"},
		{"example.com:443", "example.com"},
		{"Example.COM.:8443", "example.com"},
		{"example.com:", "example.com"}, // RFC 3986: the port may be empty
		{" a.example.com ", "a.example.com"},
		{"a..", "a."}, // a malformed name is ValidateHost's to refuse
		// IPv4.
		{"10.0.0.1", "10.0.0.1"},
		{"10.0.0.1:80", "10.0.0.1"},
		// IPv6, with and without a port, bracketed or bare: one canonical form.
		{"[::1]:8080", "::1"},
		{"[::1]", "::1"},
		{"[::1]:", "::1"},
		{"::1", "::1"},
		{"0:0:0:0:0:0:0:1", "::1"},
		{"[0::1]:80", "::1"},
		{"[2001:DB8::A]", "2001:db8::a"},
		{"::ffff:10.0.0.1", "::ffff:10.0.0.1"},
		// Empty and garbage: no host.
		{"", ""},
		{"   ", ""},
		{":", ""},
		{":80", ""},
		{".", ""},
		{"[", ""},
		{"[]", ""},
		{"[::1", ""},
		{"::1]", ""},
		{"[::1]x", ""},
		{"[::1]:80x", ""},
		{"[::1]]", ""},
		{"[a.example.com]:80", ""},
		{"[10.0.0.1]", ""},
		{"a:b:c", ""},
		{"example.com:http", ""},
		{"example.com:80:80", ""},
		{"[fe80::1%eth0]", ""},
		{"fe80::1%eth0", ""},
	} {
		if got := NormalizeHost(tc.in); got != tc.want {
			t.Errorf("NormalizeHost(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
