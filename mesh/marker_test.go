package mesh

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestMarker(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	signer := Marker{Token: testToken, Now: clock}
	verifier := Marker{Token: testToken, Now: clock}
	good := signer.Sign("8oe.example.com", now)

	for _, tc := range []struct {
		name  string
		value string
		host  string
		v     Marker
		want  error
	}{
		{"valid", good, "8oe.example.com", verifier, nil},
		{"host spelling", good, "8OE.example.com:443", verifier, nil},
		{"other host", good, "9oe.example.com", verifier, ErrMarkerBadMAC},
		{"other token", good, "8oe.example.com", Marker{Token: "other", Now: clock}, ErrMarkerBadMAC},
		{"no token", good, "8oe.example.com", Marker{Now: clock}, ErrMarkerBadMAC},
		{"59s old", good, "8oe.example.com", Marker{Token: testToken, Now: func() time.Time { return now.Add(59 * time.Second) }}, nil},
		{"61s old", good, "8oe.example.com", Marker{Token: testToken, Now: func() time.Time { return now.Add(61 * time.Second) }}, ErrMarkerStale},
		{"61s ahead", good, "8oe.example.com", Marker{Token: testToken, Now: func() time.Time { return now.Add(-61 * time.Second) }}, ErrMarkerStale},
		{"spoof 1", "1", "8oe.example.com", verifier, ErrMarkerMalformed},
		{"empty", "", "8oe.example.com", verifier, ErrMarkerMalformed},
		{"not hex", strings.Repeat("z", 64), "8oe.example.com", verifier, ErrMarkerMalformed},
		{"signed ts swapped", "1800000001" + good[len("1800000000"):], "8oe.example.com", verifier, ErrMarkerBadMAC},
		{"leading plus", "+" + good, "8oe.example.com", verifier, ErrMarkerMalformed},
		{"truncated mac", good[:len(good)-2], "8oe.example.com", verifier, ErrMarkerMalformed},
	} {
		if err := tc.v.Verify(tc.value, tc.host); err != tc.want {
			t.Errorf("%s: Verify = %v, want %v", tc.name, err, tc.want)
		}
	}
	if strings.Contains(good, testToken) {
		t.Fatal("marker carries the token")
	}
}

func TestMarkerHeaders(t *testing.T) {
	m := Marker{Token: testToken}
	h := http.Header{}
	m.Mark(h, "a.example.com")
	if !m.Valid(h, "a.example.com") || !m.Strip(h, "a.example.com") || h.Get(ForwardedHeader) == "" {
		t.Fatal("own marker not accepted and kept")
	}
	// A valid marker for another host is stripped.
	if m.Strip(h, "b.example.com") || len(h.Values(ForwardedHeader)) != 0 {
		t.Fatal("marker for another host kept")
	}
	// Spoofed, or a valid one next to a spoof: stripped, not forwarded.
	for _, vals := range [][]string{{"1"}, {m.Sign("a.example.com", time.Now()), "1"}} {
		h := http.Header{ForwardedHeader: vals}
		if m.Strip(h, "a.example.com") || len(h.Values(ForwardedHeader)) != 0 {
			t.Fatalf("%q: not stripped", vals)
		}
	}
}
