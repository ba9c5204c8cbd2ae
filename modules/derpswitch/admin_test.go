package derpswitch

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestDecodeSettings: a settings body is one object naming derp_region; a refused one
// is answered with a status (400, 413 for an oversized body) and says why.
func TestDecodeSettings(t *testing.T) {
	for _, tc := range []struct {
		body   string
		region int
		status int // 0: accepted
		msg    string
	}{
		{`{"derp_region": 2}`, 2, 0, ""},
		{`{"derp_region": 0}`, 0, 0, ""},
		{`{}`, 0, http.StatusBadRequest, `missing "derp_region"`},
		{`{"derp_region": 2, "region": 3}`, 0, http.StatusBadRequest, `decoding request body: json: unknown field "region"`},
		{`{"derp_region": 2} junk`, 0, http.StatusBadRequest, "decoding request body: trailing data after the JSON object"},
		{`{"derp_region": x}`, 0, http.StatusBadRequest, "decoding request body: malformed JSON at byte 17"},
		{`{"derp_region": 2}` + strings.Repeat(" ", maxSettingsBody), 0, http.StatusRequestEntityTooLarge, "request body larger than 65536 bytes"},
	} {
		region, err := decodeSettings(strings.NewReader(tc.body))
		name := tc.body[:min(len(tc.body), 40)]
		if tc.status == 0 {
			if err != nil || region != tc.region {
				t.Errorf("%q: got %d, %v; want %d", name, region, err, tc.region)
			}
			continue
		}
		if err == nil {
			t.Errorf("%q: accepted as %d", name, region)
			continue
		}
		var answer caddy.APIError
		if !errors.As(settingsRefused(err), &answer) || answer.HTTPStatus != tc.status || answer.Err.Error() != tc.msg {
			t.Errorf("%q: answered %#v; want %d %q", name, settingsRefused(err), tc.status, tc.msg)
		}
	}
}
