package mesh

import (
	"errors"
	"fmt"
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
		{"uppercase mac", strings.ToUpper(good), "8oe.example.com", verifier, ErrMarkerMalformed},
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

// A later forward's hop is under the MAC: it cannot be lowered (to buy more forwards)
// or raised, and a first forward's marker keeps the format older boxes verify.
func TestMarkerHops(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := Marker{Token: "tok", Now: func() time.Time { return now }}
	for hop := 1; hop <= MaxHops; hop++ {
		h := http.Header{}
		m.MarkHop(h, "a.example.com", hop)
		if got := m.Hops(h, "a.example.com"); got != hop {
			t.Errorf("hop %d read back as %d (%s)", hop, got, h.Get(ForwardedHeader))
		}
	}
	if v := m.SignHop("a.example.com", now, 1); v != m.Sign("a.example.com", now) || strings.Contains(v, ":") {
		t.Errorf("first-forward marker %q changed format", v)
	}
	v := m.SignHop("a.example.com", now, 2)
	_, rest, _ := strings.Cut(v, ":")
	for _, forged := range []string{rest, "3:" + rest, "0:" + rest, "02:" + rest, fmt.Sprintf("%d:%s", MaxHops+1, rest)} {
		h := http.Header{ForwardedHeader: {forged}}
		if got := m.StripHops(h, "a.example.com"); got != 0 || h.Get(ForwardedHeader) != "" {
			t.Errorf("forged hop %q accepted as hop %d", forged, got)
		}
	}
}

// TestMarkerVerifiesAcceptedTokens: a marker signed with a token the box accepts (a
// rotation in progress) verifies; one signed with any other token does not.
func TestMarkerVerifiesAcceptedTokens(t *testing.T) {
	oldTok, newTok := Secret(NewToken()), Secret(NewToken())
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	signedNew := Marker{Token: newTok, Now: clock}.SignHop("a.example.com", now, 2)
	if err := (Marker{Token: oldTok, Accept: []Secret{newTok}, Now: clock}).Verify(signedNew, "a.example.com"); err != nil {
		t.Fatalf("a marker of an accepted token: %v", err)
	}
	if err := (Marker{Token: oldTok, Now: clock}).Verify(signedNew, "a.example.com"); !errors.Is(err, ErrMarkerBadMAC) {
		t.Fatalf("a marker of a token not accepted: %v, want ErrMarkerBadMAC", err)
	}
}
