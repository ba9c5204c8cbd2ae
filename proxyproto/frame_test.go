package proxyproto

import (
	"errors"
	"net"
	"strings"
	"testing"

	goproxy "github.com/pires/go-proxyproto"
)

func v2Header(t testing.TB, src, dst string) []byte {
	t.Helper()
	s, _ := net.ResolveTCPAddr("tcp", src)
	d, _ := net.ResolveTCPAddr("tcp", dst)
	b, err := goproxy.HeaderProxyFromAddrs(2, s, d).Format()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHeaderLen(t *testing.T) {
	v1 := "PROXY TCP4 192.0.2.7 198.51.100.1 51000 443\r\n"
	v2 := v2Header(t, "192.0.2.7:51000", "198.51.100.1:443")
	v2Big := append([]byte(nil), v2[:16]...)
	v2Big[14], v2Big[15] = 0x20, 0x00 // 8192 bytes
	for _, tc := range []struct {
		name string
		in   string
		want int
		err  error // nil, ErrShort, or errAny
	}{
		{"empty", "", 0, ErrShort},
		{"http", "GET / HTTP/1.1\r\n", 0, nil},
		{"post starts like PROXY", "POST / HTTP/1.1\r\n", 0, nil},
		{"put", "PUT / HTTP/1.1\r\n", 0, nil},
		{"tls", "\x16\x03\x01\x02\x00", 0, nil},
		{"v1 whole", v1 + "GET / HTTP/1.1\r\n", len(v1), nil},
		{"v1 exact", v1, len(v1), nil},
		{"v1 unknown", "PROXY UNKNOWN\r\nGET", len("PROXY UNKNOWN\r\n"), nil},
		{"v1 prefix P", "P", 0, ErrShort},
		{"v1 prefix PROX", "PROX", 0, ErrShort},
		{"v1 no CRLF yet", "PROXY TCP4 192.0.2.7", 0, ErrShort},
		{"v1 LF only", "PROXY TCP4 192.0.2.7 198.51.100.1 51000 443\nGET", 0, errAny},
		{"v1 too long", "PROXY " + strings.Repeat("1", 120), 0, errAny},
		{"v2 whole", string(v2) + "GET", len(v2), nil},
		{"v2 fixed part only", string(v2[:16]), len(v2), nil},
		{"v2 signature prefix", string(v2[:5]), 0, ErrShort},
		{"v2 without length", string(v2[:13]), 0, ErrShort},
		{"v2 too long", string(v2Big), 0, errAny},
		{"CR not v2", "\r\nGET", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := HeaderLen([]byte(tc.in))
			switch {
			case tc.err == errAny && err != nil && !errors.Is(err, ErrShort):
			case tc.err == errAny:
				t.Fatalf("HeaderLen(%q) = %d, %v; want a malformed-header error", tc.in, n, err)
			case !errors.Is(err, tc.err) || (tc.err == nil && err != nil):
				t.Fatalf("HeaderLen(%q) error %v, want %v", tc.in, err, tc.err)
			case n != tc.want:
				t.Fatalf("HeaderLen(%q) = %d, want %d", tc.in, n, tc.want)
			}
		})
	}
}

var errAny = errors.New("any malformed-header error")

// FuzzHeaderLen: whatever the bytes, HeaderLen never panics, and a length it reports
// frames a header that go-proxyproto can read whole when it says it is complete.
func FuzzHeaderLen(f *testing.F) {
	f.Add([]byte("PROXY TCP4 192.0.2.7 198.51.100.1 51000 443\r\nGET / HTTP/1.1\r\n"))
	f.Add(v2Header(f, "192.0.2.7:51000", "198.51.100.1:443"))
	f.Add([]byte("PROXY UNKNOWN\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Add([]byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := HeaderLen(b)
		if err != nil {
			return
		}
		if n < 0 || (n > 0 && n < len("PROXY \r\n") && b[0] == 'P') {
			t.Fatalf("HeaderLen = %d", n)
		}
		if b[0] == 'P' && n > len(b) {
			t.Fatalf("a version 1 length %d past the %d bytes seen", n, len(b))
		}
	})
}
