package provider

import (
	"strings"

	"github.com/lchat/lchat-caddy/registry"
)

// The provider API (docs/providers.md): what a fleet asks of its provider, under the
// provider's base URL, each call with `Authorization: Bearer <the fleet's token>` and
// scoped to the spaces hosted for that fleet (Client.Owns). Answers are JSON, errors
// {"error": "..."}; a space of another fleet, or none, is 404 either way.
//
//	PUT    /api/provider/v1/spaces/{host}            host it (CreateRequest): 201, or 200 when it already is
//	GET    /api/provider/v1/spaces/{host}            its Status
//	PUT    /api/provider/v1/spaces/{host}/state      its state, as an export (export.go), before it is hosted
//	POST   /api/provider/v1/spaces/{host}/hibernate  put it to sleep everywhere and hold it asleep (a take-back)
//	POST   /api/provider/v1/spaces/{host}/resume     serve it again after a hibernate
//	GET    /api/provider/v1/spaces/{host}/export     its state as an export, signed with the provider's token (held asleep first)
//	DELETE /api/provider/v1/spaces/{host}            stop hosting it (saved first; its state stays in the provider's bucket)
const PathSpaces = "/api/provider/v1/spaces/"

// The operations under a space's path (SplitPath).
const (
	OpSpace     = ""
	OpState     = "state"
	OpHibernate = "hibernate"
	OpResume    = "resume"
	OpExport    = "export"
)

// ExportContentType is the media type of an export.
const ExportContentType = "application/vnd.lchat.space-export"

// CreateRequest is the body of a PUT of a space: what runs it. Env holds the space's own
// values, handed over with the delegation (secrets: never logged).
type CreateRequest struct {
	Kind    string            `json:"kind"`
	Version string            `json:"version,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
}

// The states of a hosted space (Status.State).
const (
	StateServing = "serving"
	StateHeld    = "held" // hibernated for a take-back: asleep everywhere, serving nothing
)

// Status is what a provider says of one hosted space.
type Status struct {
	Host string `json:"host"`
	Kind string `json:"kind"`
	// State is StateServing or StateHeld.
	State string `json:"state"`
	// Awake: the space runs on one of the provider's boxes now.
	Awake bool `json:"awake"`
	// Generation is the manifest generation of its state in the provider's bucket (0:
	// never checkpointed).
	Generation int64 `json:"generation"`
}

// Imported is the answer to a PUT of a space's state.
type Imported struct {
	Generation int64 `json:"generation"`
	Objects    int   `json:"objects"`
	Bytes      int64 `json:"bytes"`
	// Skipped: the provider already had this generation or a newer one.
	Skipped bool `json:"skipped,omitempty"`
}

// SplitPath reads a provider API path: the host and the operation; ok false for a path
// that is no operation of the API.
func SplitPath(p string) (host, op string, ok bool) {
	rest, ok := strings.CutPrefix(p, PathSpaces)
	if !ok {
		return "", "", false
	}
	host, op, _ = strings.Cut(rest, "/")
	switch op {
	case OpSpace, OpState, OpHibernate, OpResume, OpExport:
	default:
		return "", "", false
	}
	if registry.ValidateHost(host) != nil {
		return "", "", false
	}
	return host, op, true
}
