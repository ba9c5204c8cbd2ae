package lchat

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddytls"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/registry"
)

// wildcardEnv is the default of App.WildcardDomains.
const wildcardEnv = "{env.LCHAT_WILDCARD_DOMAINS}"

// provisionWildcards expands and checks WildcardDomains and, when there are any,
// makes sure the tls app can obtain a certificate for each: a wildcard is DNS-01
// only, so the policy that covers *.<domain> must have an ACME issuer with a DNS
// challenge. Checking here turns a setup mistake into a start-up error instead of an
// issuance that fails over and over in the log.
//
// A Caddyfile site address is substituted before tokenizing, so a list of domains in
// one environment variable cannot become several site addresses; the lchat app asks
// the tls app for the wildcards instead, and a catch-all HTTPS site serves them.
func (a *App) provisionWildcards(ctx caddy.Context) error {
	raw, source := a.WildcardDomains, "wildcard_domains"
	if len(raw) == 0 {
		raw, source = []string{wildcardEnv}, "LCHAT_WILDCARD_DOMAINS"
	}
	repl := caddy.NewReplacer()
	expanded := make([]string, len(raw))
	for i, v := range raw {
		expanded[i] = repl.ReplaceKnown(v, "")
	}
	domains, err := registry.ParseWildcardDomains(expanded)
	if err != nil {
		return fmt.Errorf("%s: %v", source, err)
	}
	if len(domains) == 0 {
		if len(a.WildcardDomains) > 0 {
			// Configured explicitly (the shipped Caddyfiles do), so an empty value is a
			// mistake, most likely an unset environment variable. The raw value holds
			// placeholders, never their values.
			return fmt.Errorf("wildcard_domains: %q names no domain (is the environment variable set?)",
				strings.Join(a.WildcardDomains, " "))
		}
		return nil
	}
	a.WildcardDomains = domains

	// ctx.App provisions the tls app if no other app has yet (and creates an empty
	// one if the config has none, which the check below then refuses).
	val, err := ctx.App("tls")
	if err != nil {
		return fmt.Errorf("wildcard_domains: loading the tls app: %v", err)
	}
	tlsApp, ok := val.(*caddytls.TLS)
	if !ok {
		return fmt.Errorf("wildcard_domains: the tls app is a %T", val)
	}
	for _, d := range domains {
		if err := checkDNSChallenge(tlsApp, "*."+d); err != nil {
			return fmt.Errorf("wildcard_domains: cannot obtain *.%s: %v; configure a DNS-01 challenge "+
				"(Caddyfile: `tls { dns <provider> ... }` in the site that serves it, or the global "+
				"`acme_dns <provider>` option)", d, err)
		}
	}
	a.tlsApp = tlsApp
	return nil
}

// manageWildcards asks the tls app to obtain and renew the wildcard certificates.
// It runs at Start, like the http app's own Manage call: the tls app may start
// before or after this app, and Manage works either way once it is provisioned.
func (a *App) manageWildcards() error {
	if a.tlsApp == nil {
		return nil
	}
	list := registry.WildcardNames(a.WildcardDomains)
	names := make(map[string]struct{}, len(list))
	for _, n := range list {
		names[n] = struct{}{}
	}
	if err := a.tlsApp.Manage(names); err != nil {
		return fmt.Errorf("managing wildcard certificates: %v", err)
	}
	a.logger.Info("managing wildcard certificates", zap.Strings("names", list))
	return nil
}

// checkDNSChallenge reports why the tls app could not issue name, a wildcard: the
// first automation policy that matches it (the tls app's own rule) must have an
// issuer that can: an ACME issuer with a DNS challenge, or an issuer that is not ACME
// (the internal CA issues wildcards without a challenge).
func checkDNSChallenge(t *caddytls.TLS, name string) error {
	var ap *caddytls.AutomationPolicy
	if t.Automation != nil {
		for _, p := range t.Automation.Policies {
			subjects := p.Subjects()
			if len(subjects) == 0 || slices.ContainsFunc(subjects, func(s string) bool { return certmagic.MatchWildcard(name, s) }) {
				ap = p
				break
			}
		}
	}
	if ap == nil {
		return errors.New("no TLS automation policy covers it, and the default issuers use HTTP and TLS-ALPN challenges, which cannot validate a wildcard")
	}
	for _, iss := range ap.Issuers {
		ai, ok := iss.(interface{ GetACMEIssuer() *caddytls.ACMEIssuer })
		if !ok {
			return nil
		}
		if acme := ai.GetACMEIssuer(); acme != nil && acme.Challenges != nil && acme.Challenges.DNS != nil {
			return nil
		}
	}
	return errors.New("the TLS automation policy that covers it has no issuer with a DNS challenge")
}
