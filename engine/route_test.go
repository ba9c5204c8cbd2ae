package engine

import (
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/registry"
)

func TestCheckRoute(t *testing.T) {
	kinds := map[string]Kind{"lchat": {Name: "lchat", AllowedEnv: []string{"ADMIN_TOKEN"}}}
	for _, tc := range []struct {
		name    string
		rt      registry.Route
		wantErr string
	}{
		{name: "space of a configured kind", rt: registry.Route{Host: "a.example.com", Kind: "lchat", Hibernate: true}},
		{name: "allowed env", rt: registry.Route{Host: "a.example.com", Kind: "lchat", Hibernate: true, Env: map[string]string{"ADMIN_TOKEN": "x"}}},
		{name: "env not allowed", rt: registry.Route{Host: "a.example.com", Kind: "lchat", Hibernate: true, Env: map[string]string{"OTHER": "secret"}},
			wantErr: "env OTHER is not allowed"},
		{name: "unknown kind", rt: registry.Route{Host: "a.example.com", Kind: "wiki", Hibernate: true}, wantErr: `kind "wiki" is not configured`},
		{name: "live route needs no kind", rt: registry.Route{Host: "a.example.com", Upstream: "127.0.0.1:9"}},
		{name: "live route with a kind is checked", rt: registry.Route{Host: "a.example.com", Kind: "wiki", Upstream: "127.0.0.1:9"},
			wantErr: `kind "wiki" is not configured`},
		{name: "invalid route", rt: registry.Route{Host: "A.example.com", Kind: "lchat", Hibernate: true}, wantErr: "host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckRoute(kinds, &tc.rt)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckRoute = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("CheckRoute = %v, want error containing %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("CheckRoute error carries an env value: %v", err)
			}
		})
	}
}
