package console

import (
	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/fleetview"
)

// ProviderSource is what the lchat app offers the console of the provider seam
// (docs/providers.md): the document of GET /lchat/providers, this box's view of its
// providers' health and of the spaces delegated to each and hosted here for others. It
// returns nil when the config names no provider and no client fleet.
type ProviderSource interface {
	ProviderStatus() *adminapi.Providers
}

// Delegation is a space delegated to a provider, as this box knows it: the provider, where
// the space stands with it, and the provider's health as this box has seen it
// (adminapi.ProviderStatus: "unknown" before any request to it finished, "healthy" when
// the last one got an answer, "failing" when it got none).
type Delegation struct {
	Provider string `json:"name"`
	URL      string `json:"url"`
	// State is "serving" (the provider serves it), "delegating" or "reclaiming".
	State     string `json:"state"`
	Health    string `json:"health"`
	Healthy   bool   `json:"healthy"`
	LastError string `json:"last_error,omitempty"`
}

// seamView is the provider seam on a page: the providers and client fleets, and each
// listed space's side of it.
type seamView struct {
	// Providers is nil when the config has no provider and no client fleet.
	Providers *adminapi.Providers
	// Delegated maps a delegated host to its delegation; Hosted a host hosted here to the
	// client fleet it is hosted for.
	Delegated map[string]*Delegation
	Hosted    map[string]string
}

// readSeam reads the seam from the lchat app, when it offers it.
func (h *Handler) readSeam() seamView {
	var v seamView
	if h.prov == nil {
		return v
	}
	v.Providers = h.prov.ProviderStatus()
	if v.Providers == nil {
		return v
	}
	v.Delegated, v.Hosted = map[string]*Delegation{}, map[string]string{}
	for _, p := range v.Providers.Providers {
		for _, sp := range p.Spaces {
			v.Delegated[sp.Host] = &Delegation{Provider: p.Name, URL: p.URL, State: sp.State, Health: p.Health, Healthy: p.Healthy, LastError: p.LastError}
		}
	}
	for _, c := range v.Providers.Clients {
		for _, host := range c.Spaces {
			v.Hosted[host] = c.Name
		}
	}
	return v
}

// apiSpace is a space in /api/spaces: fleetview's, with its side of the provider seam.
type apiSpace struct {
	fleetview.Space
	// Provider is the space's delegation; nil when it is the fleet's own.
	Provider *Delegation `json:"provider,omitempty"`
	// HostedFor names the fleet this box's fleet hosts it for, as a provider.
	HostedFor string `json:"hosted_for,omitempty"`
}

// withSeam is spaces as /api/spaces lists them.
func (v seamView) withSeam(spaces []fleetview.Space) []apiSpace {
	out := make([]apiSpace, len(spaces))
	for i, sp := range spaces {
		out[i] = apiSpace{Space: sp, Provider: v.Delegated[sp.Host], HostedFor: v.Hosted[sp.Host]}
	}
	return out
}

// apiProviders is /api/providers: the seam's document, with empty lists when the config
// has none.
func (v seamView) apiProviders() *adminapi.Providers {
	if v.Providers == nil {
		return &adminapi.Providers{Providers: []adminapi.ProviderStatus{}, Clients: []adminapi.ClientStatus{}}
	}
	return v.Providers
}
