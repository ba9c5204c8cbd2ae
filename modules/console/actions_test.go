package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"testing"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/registry"
)

// TestActionErrorsCarryTheBoxStatus: an action the box refuses answers the status the
// box gives the refusal (as the admin API does), so an operator tells "no such space"
// from "not now" from a failure; a failure the box does not classify is a 500.
func TestActionErrorsCarryTheBoxStatus(t *testing.T) {
	b := boxtest.Open(t, boxtest.Options{})
	const asleep = "asleep.example.com"
	if _, err := b.Create(context.Background(), registry.Spec{Host: asleep, Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	on := newHandler(b.Console(), b.Console())
	for _, tc := range []struct {
		name, action, host, region string
		confirm                    string // default: host
		want                       int
	}{
		{name: "hibernate an unknown host", action: "hibernate", host: "zzz.example.com", want: http.StatusNotFound},
		{name: "remove an unknown host", action: "remove", host: "zzz.example.com", want: http.StatusNotFound},
		{name: "hibernate a space not awake here", action: "hibernate", host: asleep, want: http.StatusConflict},
		{name: "relocate without the mesh", action: "relocate", host: asleep, region: "eu", want: http.StatusConflict},
		// The form's host is normalized as a Host header is: the same route, confirmed
		// by typing the host the confirmation page shows.
		{name: "hibernate a space not awake here, host as typed", action: "hibernate", host: "Asleep.Example.COM.", confirm: asleep, want: http.StatusConflict},
		{name: "a host that is not one", action: "hibernate", host: "[::1", want: http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			form := url.Values{"host": {tc.host}, "confirm": {tc.host}}
			if tc.confirm != "" {
				form.Set("confirm", tc.confirm)
			}
			if tc.region != "" {
				form.Set("region", tc.region)
			}
			if w := postAction(on, tc.action, form, "same-origin"); w.Code != tc.want {
				t.Fatalf("%s %s: %d %s, want %d", tc.action, tc.host, w.Code, w.Body.String(), tc.want)
			}
		})
	}
	if w := postAction(on, "remove", url.Values{"host": {asleep}, "confirm": {asleep}}, "same-origin"); w.Code != http.StatusSeeOther {
		t.Fatalf("remove %s: %d %s", asleep, w.Code, w.Body.String())
	}

	failing := newHandler(&fakeSource{}, &fakeSource{actionErr: errors.New("disk full")})
	if w := postAction(failing, "hibernate", url.Values{"host": {"a.example.com"}, "confirm": {"a.example.com"}}, "same-origin"); w.Code != http.StatusInternalServerError {
		t.Fatalf("an unclassified failure: %d %s, want 500", w.Code, w.Body.String())
	}
}
