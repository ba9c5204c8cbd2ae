package registry

import "fmt"

// The states of a delegation (Route.ProviderState) while Route.Provider is set.
const (
	// ProviderDelegating: the space is on its way to the provider (asleep here, its state
	// being handed over); no side serves it.
	ProviderDelegating = "delegating"
	// ProviderReclaiming: the space is on its way back from the provider; no side serves it.
	// On the provider's side (a route hosted for another fleet) the same state holds the
	// space asleep for its take-back.
	ProviderReclaiming = "reclaiming"
)

// Delegated reports whether the space is not this fleet's to run now: delegated to a
// provider, or moving between this fleet and its provider (on either side). No box wakes
// such a space: not a request, not an operator's wake, not a scheduled wake.
func (rt *Route) Delegated() bool { return rt.Provider != "" || rt.ProviderState != "" }

// ValidateProviderName accepts the name of a provider or of a fleet a provider hosts for
// (Route.Provider, Route.HostedFor): 1 to 32 of a-z, 0-9 and '-', starting with a letter
// or a digit.
func ValidateProviderName(n string) error {
	if n == "" || len(n) > 32 || n[0] == '-' {
		return fmt.Errorf("provider name %q must be 1 to 32 of a-z, 0-9 and '-', not starting with '-'", n)
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("provider name %q contains %q; only a-z, 0-9 and '-' are allowed", n, c)
		}
	}
	return nil
}

// ValidateProvider checks the delegation fields: only a hibernating space is delegated
// (its state is what moves), a state needs a provider, and a space is either delegated
// by this fleet or hosted for another, never both.
func (rt *Route) ValidateProvider() error {
	if rt.Provider != "" {
		if err := ValidateProviderName(rt.Provider); err != nil {
			return fmt.Errorf("route %s: provider: %v", rt.Host, err)
		}
		if !rt.Hibernate {
			return fmt.Errorf("route %s: only a hibernating space can be delegated to a provider", rt.Host)
		}
	}
	switch rt.ProviderState {
	case "":
	case ProviderDelegating, ProviderReclaiming:
		held := rt.HostedFor != "" && rt.ProviderState == ProviderReclaiming
		if rt.Provider == "" && !held {
			return fmt.Errorf("route %s: provider_state %q needs a provider", rt.Host, rt.ProviderState)
		}
	default:
		return fmt.Errorf("route %s: provider_state must be empty, %q or %q", rt.Host, ProviderDelegating, ProviderReclaiming)
	}
	if rt.HostedFor != "" {
		if err := ValidateProviderName(rt.HostedFor); err != nil {
			return fmt.Errorf("route %s: hosted_for: %v", rt.Host, err)
		}
		if rt.Provider != "" {
			return fmt.Errorf("route %s: a space hosted for another fleet cannot be delegated on", rt.Host)
		}
		if !rt.Hibernate {
			return fmt.Errorf("route %s: a space hosted for another fleet must hibernate", rt.Host)
		}
	}
	return nil
}
