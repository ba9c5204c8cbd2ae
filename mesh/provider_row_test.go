package mesh

import (
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/registry"
)

// TestRowCarriesDelegation: the delegation fields replicate like home_region (a row
// from a route and back keeps them), and a row breaking their rule is refused.
func TestRowCarriesDelegation(t *testing.T) {
	n := &Node{Self: "https://a.example.com"}
	rt := registry.Route{Host: "s.example.com", Kind: "k", Hibernate: true, Provider: "partner", ProviderState: registry.ProviderDelegating}
	row := n.RowFromRoute(&rt)
	if err := row.Validate(); err != nil {
		t.Fatal(err)
	}
	back := RouteFromRow(row)
	if back.Provider != "partner" || back.ProviderState != registry.ProviderDelegating {
		t.Fatalf("round trip lost the delegation: %+v", back)
	}
	hosted := RouteRow{Host: "s.example.com", Kind: "k", Hibernate: true, HostedFor: "fleet-a"}
	if err := hosted.Validate(); err != nil || RouteFromRow(hosted).HostedFor != "fleet-a" {
		t.Fatalf("hosted_for row: %v", err)
	}
	bad := RouteRow{Host: "s.example.com", Kind: "k", Hibernate: true, Provider: "p", HostedFor: "a"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "provider") {
		t.Fatalf("row both delegated and hosted: err = %v", err)
	}
}
