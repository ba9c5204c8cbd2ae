package certs

import (
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestACMEHarness checks the test CA itself: pebble serves a directory, hands out
// its issuing root, and challtestsrv takes TXT records.
func TestACMEHarness(t *testing.T) {
	a := harness.StartACME(t, "mesh.test")
	if !strings.Contains(string(a.RootPEM), "BEGIN CERTIFICATE") {
		t.Fatalf("root is not a PEM certificate: %q", a.RootPEM)
	}
	a.RootPool(t)
	if n := a.Orders(t); n != 0 {
		t.Fatalf("a fresh pebble reports %d orders", n)
	}
}
