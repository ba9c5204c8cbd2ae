package derpswitch

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzSettingsBody: a POST /derp_switch/settings body is either refused or exactly one
// object naming derp_region, whose value is what the decoder returns.
func FuzzSettingsBody(f *testing.F) {
	for _, s := range []string{`{"derp_region": 2}`, `{"derp_region": 0}`, `{"derp_region": -1}`, `{}`, `{"derp_region": 2}{"derp_region": 3}`,
		`{"derp_region": 2, "x": 1}`, `{"derp_region": "2"}`, `{"derp_region": 1e99}`, `null`, `[]`, ``, `{"derp_region": 2} junk`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		region, err := decodeSettings(strings.NewReader(body))
		if err != nil {
			return
		}
		var req map[string]json.RawMessage
		if json.NewDecoder(strings.NewReader(body)).Decode(&req) != nil || len(req) != 1 {
			t.Fatalf("accepted %q, which is not one object with one field", body)
		}
		var want int
		for k, v := range req { // encoding/json matches field names case-insensitively
			if !strings.EqualFold(k, "derp_region") || json.Unmarshal(v, &want) != nil {
				t.Fatalf("accepted %q with field %q", body, k)
			}
		}
		if want != region {
			t.Fatalf("accepted %q as region %d", body, region)
		}
	})
}
