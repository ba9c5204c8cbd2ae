package adminapi

// The provider seam's admin wire (docs/providers.md): GET /lchat/providers, the
// providers part of GET /lchat/status, POST /lchat/providers/delegate/{host} and
// POST /lchat/providers/reclaim/{host}.

// Providers is the GET /lchat/providers answer, and the "providers" of GET /lchat/status.
type Providers struct {
	// Providers are the partners this fleet may delegate to, with the spaces delegated
	// to each and its health as this box has seen it.
	Providers []ProviderStatus `json:"providers"`
	// Clients are the fleets this fleet hosts spaces for.
	Clients []ClientStatus `json:"clients"`
}

// ProviderStatus is one provider as this box sees it. No token appears.
type ProviderStatus struct {
	Name      string   `json:"name"`
	URL       string   `json:"url"`
	Domains   []string `json:"domains"`
	MaxSpaces int      `json:"max_spaces,omitempty"`
	// Health is "unknown" until a request to it has finished on this box, then
	// "healthy" (the last one got an answer) or "failing" (it got none).
	Health string `json:"health"`
	// Healthy is Health == "healthy": false while it is unknown.
	Healthy bool `json:"healthy"`
	// Requests and Errors count this box's requests to it since it started; LastError
	// is this box's word for the last failure.
	Requests  uint64 `json:"requests"`
	Errors    uint64 `json:"errors"`
	LastError string `json:"last_error,omitempty"`
	// Spaces are the routes delegated to it, with where each stands.
	Spaces []DelegatedSpace `json:"spaces"`
}

// DelegatedSpace is a route delegated to a provider.
type DelegatedSpace struct {
	Host string `json:"host"`
	// State is "serving" (the provider serves it), "delegating" or "reclaiming".
	State string `json:"state"`
}

// ClientStatus is a fleet this fleet hosts for, with the spaces hosted for it.
type ClientStatus struct {
	Name      string   `json:"name"`
	Domains   []string `json:"domains"`
	MaxSpaces int      `json:"max_spaces,omitempty"`
	Spaces    []string `json:"spaces"`
}

// DelegateRequest is the POST /lchat/providers/delegate/{host} body.
type DelegateRequest struct {
	// To names the provider.
	To string `json:"to"`
}
