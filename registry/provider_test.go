package registry

import (
	"strings"
	"testing"
)

// TestValidateProvider: the delegation fields' one rule, as every door (admin API,
// replication, the provider API) applies it through Route.Validate.
func TestValidateProvider(t *testing.T) {
	for _, tc := range []struct {
		name string
		rt   Route
		bad  string // a part of the error; empty: valid
	}{
		{"own space", Route{Hibernate: true, Kind: "k"}, ""},
		{"delegated", Route{Hibernate: true, Kind: "k", Provider: "partner-1"}, ""},
		{"delegating", Route{Hibernate: true, Kind: "k", Provider: "p", ProviderState: ProviderDelegating}, ""},
		{"reclaiming", Route{Hibernate: true, Kind: "k", Provider: "p", ProviderState: ProviderReclaiming}, ""},
		{"hosted", Route{Hibernate: true, Kind: "k", HostedFor: "fleet-a"}, ""},
		{"hosted, held for a take-back", Route{Hibernate: true, Kind: "k", HostedFor: "fleet-a", ProviderState: ProviderReclaiming}, ""},
		{"hosted, delegating", Route{Hibernate: true, Kind: "k", HostedFor: "fleet-a", ProviderState: ProviderDelegating}, "needs a provider"},
		{"bad provider name", Route{Hibernate: true, Kind: "k", Provider: "Partner"}, "provider name"},
		{"provider name starting with -", Route{Hibernate: true, Kind: "k", Provider: "-p"}, "provider name"},
		{"long provider name", Route{Hibernate: true, Kind: "k", Provider: strings.Repeat("p", 33)}, "provider name"},
		{"live route delegated", Route{Upstream: "127.0.0.1:9", Provider: "p"}, "only a hibernating space"},
		{"state without provider", Route{Hibernate: true, Kind: "k", ProviderState: ProviderDelegating}, "needs a provider"},
		{"unknown state", Route{Hibernate: true, Kind: "k", Provider: "p", ProviderState: "moving"}, "provider_state must be"},
		{"hosted and delegated", Route{Hibernate: true, Kind: "k", Provider: "p", HostedFor: "a"}, "cannot be delegated on"},
		{"bad hosted_for", Route{Hibernate: true, Kind: "k", HostedFor: "a b"}, "hosted_for"},
		{"hosted live route", Route{Upstream: "127.0.0.1:9", HostedFor: "a"}, "must hibernate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.rt.Host = "x.example.com"
			err := tc.rt.Validate()
			switch {
			case tc.bad == "" && err != nil:
				t.Fatalf("valid route refused: %v", err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Fatalf("err = %v, want one saying %q", err, tc.bad)
			}
		})
	}
}
