package engine

import "github.com/lchat/lchat-caddy/registry"

// CheckRoute refuses a route a box with kinds cannot serve: one registry refuses
// (Route.Validate), a space whose kind is not configured, or env names its kind does
// not allow. A live route without a kind runs no space here and needs no kind.
func CheckRoute(kinds map[string]Kind, rt *registry.Route) error {
	if err := rt.Validate(); err != nil {
		return err
	}
	if !rt.Hibernate && rt.Kind == "" {
		return nil
	}
	return CheckSpaceKind(kinds, rt.Kind, rt.Env)
}
