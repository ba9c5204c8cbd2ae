package registry

import (
	"errors"
	"fmt"
	"strconv"
)

// Spec is what an operator asks for when creating a route (POST /lchat/routes): the
// route's fields before the defaults apply.
type Spec struct {
	Host       string
	Kind       string
	Version    string
	Hibernate  *bool
	HomeRegion string
	Env        map[string]string
	Upstream   string
	// Mint names the host from the next id instead; Host must then be empty.
	Mint bool
}

// ErrHostAndMint refuses a Spec that names a host and asks for a minted one.
var ErrHostAndMint = errors.New(`give "host" or "mint", not both`)

// NewRoute applies the create defaults to s: a route without an upstream hibernates
// unless s says otherwise, and a route without a home region takes defaultRegion (the
// box's LCHAT_CLOUD_REGION, may be empty). The home region is checked; the rest of
// the route is checked where it is stored (Route.Validate and the app's kinds).
func NewRoute(s Spec, defaultRegion string) (Route, error) {
	rt := Route{
		Host:       s.Host,
		Kind:       s.Kind,
		Version:    s.Version,
		Hibernate:  s.Upstream == "",
		HomeRegion: s.HomeRegion,
		Env:        s.Env,
		Upstream:   s.Upstream,
	}
	if s.Hibernate != nil {
		rt.Hibernate = *s.Hibernate
	}
	if rt.HomeRegion == "" {
		rt.HomeRegion = defaultRegion
	}
	if rt.HomeRegion != "" {
		if err := ValidateRegion(rt.HomeRegion); err != nil {
			return Route{}, fmt.Errorf("home_region: %v", err)
		}
	}
	if s.Mint && s.Host != "" {
		return Route{}, ErrHostAndMint
	}
	return rt, nil
}

// SetHibernate returns cur with hibernation turned on or off. Turning it on drops the
// live upstream and LivesAt; turning it off with an upstream makes the route live on
// this box (LivesAt cleared); turning it off without one keeps cur's.
func SetHibernate(cur Route, on bool, upstream string) Route {
	next := cur
	next.Hibernate = on
	if on {
		next.Upstream, next.LivesAt = "", ""
	} else if upstream != "" {
		next.Upstream, next.LivesAt = upstream, ""
	}
	return next
}

// Page sizes of a route listing (GET /lchat/routes?limit=).
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

// ParsePageLimit reads a listing's limit: empty is DefaultPageLimit, otherwise a
// number from 1 to MaxPageLimit.
func ParsePageLimit(s string) (int, error) {
	if s == "" {
		return DefaultPageLimit, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxPageLimit {
		return 0, fmt.Errorf("limit must be a number from 1 to %d, got %q", MaxPageLimit, s)
	}
	return n, nil
}
