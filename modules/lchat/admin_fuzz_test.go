package lchat

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// FuzzAdminCreateRoute: whatever body POST /lchat/routes gets, the answer is a 2xx or a
// 4xx (never a 5xx or a panic), a stored route passes the registry's rules, and no
// answer echoes an env value.
func FuzzAdminCreateRoute(f *testing.F) {
	for _, s := range []string{
		`{"host":"a.example.com","kind":"demo"}`,
		`{"host":"a.example.com","kind":"demo","env":{"ADMIN_TOKEN":"s3cr3t-value"}}`,
		`{"host":"b.example.com","upstream":"127.0.0.1:9000"}`,
		`{"host":"c.example.com","kind":"demo","home_region":"EU"}`,
		`{"host":"A.EXAMPLE.COM","kind":"nosuch"}`, `{"host":"a.example.com","kind":"demo"} {}`,
		`{"host":"a.example.com","kind":"demo","hibernate":false}`, `{"host":"x.example.com","bogus":1}`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	a := newTestAdmin(f)
	var n int
	f.Fuzz(func(t *testing.T, body []byte) {
		// A body with env values has each replaced by a marker no other part of the
		// answer can hold, so an echo is found exactly: a value searched for as it was
		// given may be part of the host, the kind or an error's own words.
		var markers []string
		var obj map[string]any
		if json.Unmarshal(body, &obj) == nil {
			if env, ok := obj["env"].(map[string]any); ok {
				for k, v := range env {
					if _, ok := v.(string); ok {
						n++
						m := fmt.Sprintf("zqenvvalue%08dzq", n)
						env[k] = m
						markers = append(markers, m)
					}
				}
				body, _ = json.Marshal(obj)
			}
		}
		code, resp := adminRaw(a, "POST", "/lchat/routes", string(body))
		if code >= 500 || code < 200 { // adminRaw's 0: a non-API error
			t.Fatalf("POST %q: %d %s", body, code, resp)
		}
		for _, m := range markers {
			if strings.Contains(resp, m) {
				t.Fatalf("answer to %q echoes an env value: %s", body, resp)
			}
		}
		var req struct {
			Host string `json:"host"`
		}
		json.Unmarshal(body, &req)
		if code != 201 {
			return
		}
		rt, err := a.app.box.Registry().Get(req.Host)
		if err != nil {
			t.Fatalf("POST %q answered 201, but the route is not stored: %v", body, err)
		}
		if err := rt.Validate(); err != nil {
			t.Fatalf("POST %q stored an invalid route: %v", body, err)
		}
		a.app.box.Registry().Delete(req.Host)
	})
}

// FuzzAdminHibernate: the hibernate body never makes a 5xx or a panic.
func FuzzAdminHibernate(f *testing.F) {
	for _, s := range []string{`{"hibernate":true}`, `{"hibernate":false,"upstream":"127.0.0.1:9"}`, `{"hibernate":false}`, `{}`, `null`, `{"hibernate":"yes"}`} {
		f.Add([]byte(s))
	}
	a := newTestAdmin(f)
	if code, resp := adminRaw(a, "POST", "/lchat/routes", `{"host":"h.example.com","kind":"demo"}`); code != 201 {
		f.Fatalf("creating the route: %d %s", code, resp)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		code, resp := adminRaw(a, "POST", "/lchat/routes/h.example.com/hibernate", string(body))
		if code >= 500 || code < 200 { // adminRaw's 0: a non-API error
			t.Fatalf("hibernate %q: %d %s", body, code, resp)
		}
		if rt, err := a.app.box.Registry().Get("h.example.com"); err == nil {
			if err := rt.Validate(); err != nil {
				t.Fatalf("hibernate %q stored an invalid route: %v", body, err)
			}
		}
	})
}
