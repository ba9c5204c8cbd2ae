package registry

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestNewRoute(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name    string
		spec    Spec
		region  string
		want    Route
		wantErr string
	}{
		{name: "space by default", spec: Spec{Host: "a.example.com", Kind: "lchat"},
			want: Route{Host: "a.example.com", Kind: "lchat", Hibernate: true}},
		{name: "upstream makes a live route", spec: Spec{Host: "a.example.com", Upstream: "127.0.0.1:9"},
			want: Route{Host: "a.example.com", Upstream: "127.0.0.1:9"}},
		{name: "explicit hibernate wins over upstream", spec: Spec{Host: "a.example.com", Upstream: "127.0.0.1:9", Hibernate: &yes},
			want: Route{Host: "a.example.com", Upstream: "127.0.0.1:9", Hibernate: true}},
		{name: "explicit live without upstream", spec: Spec{Host: "a.example.com", Hibernate: &no},
			want: Route{Host: "a.example.com"}},
		{name: "box region is the default", spec: Spec{Host: "a.example.com"}, region: "fi",
			want: Route{Host: "a.example.com", Hibernate: true, HomeRegion: "fi"}},
		{name: "own region wins", spec: Spec{Host: "a.example.com", HomeRegion: "de"}, region: "fi",
			want: Route{Host: "a.example.com", Hibernate: true, HomeRegion: "de"}},
		{name: "env and version carried", spec: Spec{Host: "a.example.com", Version: "2", Env: map[string]string{"K": "v"}},
			want: Route{Host: "a.example.com", Version: "2", Env: map[string]string{"K": "v"}, Hibernate: true}},
		{name: "bad region", spec: Spec{Host: "a.example.com", HomeRegion: "FI"}, wantErr: "home_region: "},
		{name: "bad default region", spec: Spec{Host: "a.example.com"}, region: "f i", wantErr: "home_region: "},
		{name: "mint without host", spec: Spec{Mint: true},
			want: Route{Hibernate: true}},
		{name: "mint and host", spec: Spec{Host: "a.example.com", Mint: true}, wantErr: ErrHostAndMint.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NewRoute(tc.spec, tc.region)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NewRoute = %+v, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("NewRoute = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	if _, err := NewRoute(Spec{Host: "a.example.com", Mint: true}, ""); !errors.Is(err, ErrHostAndMint) {
		t.Fatalf("host and mint: %v, want ErrHostAndMint", err)
	}
}

func TestSetHibernate(t *testing.T) {
	space := Route{Host: "a.example.com", Kind: "lchat", Hibernate: true}
	live := Route{Host: "a.example.com", Upstream: "127.0.0.1:9"}
	pinned := Route{Host: "a.example.com", LivesAt: "https://box2.example.net"}
	for _, tc := range []struct {
		name     string
		cur      Route
		on       bool
		upstream string
		want     Route
	}{
		{name: "live to space drops upstream", cur: live, on: true,
			want: Route{Host: "a.example.com", Hibernate: true}},
		{name: "pinned to space drops lives_at", cur: pinned, on: true,
			want: Route{Host: "a.example.com", Hibernate: true}},
		{name: "space to live here", cur: space, on: false, upstream: "127.0.0.1:7",
			want: Route{Host: "a.example.com", Kind: "lchat", Upstream: "127.0.0.1:7"}},
		{name: "space to live keeps none", cur: space, on: false,
			want: Route{Host: "a.example.com", Kind: "lchat"}},
		{name: "pinned brought here", cur: pinned, on: false, upstream: "127.0.0.1:7",
			want: Route{Host: "a.example.com", Upstream: "127.0.0.1:7"}},
		{name: "pinned stays pinned", cur: pinned, on: false, want: pinned},
		{name: "space stays space", cur: space, on: true, want: space},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SetHibernate(tc.cur, tc.on, tc.upstream)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("SetHibernate = %+v; want %+v", got, tc.want)
			}
		})
	}
}

func TestParsePageLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"", 100, true}, {"1", 1, true}, {"1000", 1000, true},
		{"0", 0, false}, {"1001", 0, false}, {"-3", 0, false}, {"ten", 0, false}, {" 5", 0, false},
	} {
		got, err := ParsePageLimit(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParsePageLimit(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
