package lchat

import (
	"encoding/json"
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
	f.Fuzz(func(t *testing.T, body []byte) {
		code, resp := adminRaw(a, "POST", "/lchat/routes", string(body))
		if code >= 500 || code < 200 { // adminRaw's 0: a non-API error
			t.Fatalf("POST %q: %d %s", body, code, resp)
		}
		var req struct {
			Host string            `json:"host"`
			Env  map[string]string `json:"env"`
		}
		json.Unmarshal(body, &req)
		for _, v := range req.Env {
			if len(v) >= 6 && strings.Contains(resp, v) {
				t.Fatalf("answer to %q echoes an env value: %s", body, resp)
			}
		}
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
