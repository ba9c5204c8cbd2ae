package lchat

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
)

// TestIDLedgerNamespaceFailsTheConfigLoad: a LCHAT_CLOUD_ID_LEDGER the ledger would
// refuse fails the lchat app's load, so that `lchat-caddy validate` and a box without
// the admin API say so instead of failing every id it mints; a valid one, or none, loads.
func TestIDLedgerNamespaceFailsTheConfigLoad(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		wantErr   bool
	}{
		{name: "unset"},
		{name: "valid", env: "spaces"},
		{name: "valid with spaces around", env: " spaces.eu-1 "},
		{name: "slash", env: "spaces/eu", wantErr: true},
		{name: "dot-dot", env: "..", wantErr: true},
		{name: "too long", env: strings.Repeat("n", 129), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envIDLedger, tc.env)
			err := validateWildcards(t, nil)
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("config refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), envIDLedger) {
				t.Fatalf("config with %s=%q: %v, want it refused naming the variable", envIDLedger, tc.env, err)
			}
		})
	}
}

// TestIDsEndpointServesTheAppsNamespace: the id endpoints draw from the namespace the
// lchat app read (the one the box mints hosts from), and are off when it read none.
func TestIDsEndpointServesTheAppsNamespace(t *testing.T) {
	app := testApp(t, boxtest.Options{})
	app.settings = &box.Settings{IDLedger: "spaces"}
	ids := &idsAdmin{appRef{app}}
	w := httptest.NewRecorder()
	if err := ids.serve(w, httptest.NewRequest(http.MethodPost, "http://localhost:2019/lchat/ids", nil)); err != nil {
		t.Fatal(err)
	}
	var got adminapi.IDResult
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got.Namespace != "spaces" || got.ID == 0 {
		t.Fatalf("POST /lchat/ids: %d %s (%v)", w.Code, w.Body.String(), err)
	}

	app.settings = &box.Settings{}
	err := ids.serve(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "http://localhost:2019/lchat/ids", nil))
	var ae caddy.APIError
	if !errors.As(err, &ae) || ae.HTTPStatus != http.StatusNotFound || !strings.Contains(ae.Err.Error(), envIDLedger+" is not set") {
		t.Fatalf("POST /lchat/ids without a namespace: %v, want 404 saying %s is not set", err, envIDLedger)
	}
}
