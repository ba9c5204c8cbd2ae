package mesh

import (
	"net/http"
	"net/url"
	"testing"
)

func TestDialAddr(t *testing.T) {
	for _, tc := range []struct{ self, want string }{
		{"https://box1.example.net", "box1.example.net:443"},
		{"http://box1.example.net", "box1.example.net:80"},
		{"https://box1.example.net:8443", "box1.example.net:8443"},
		{"http://127.0.0.1:9001", "127.0.0.1:9001"},
		{"http://[::1]", "[::1]:80"},
	} {
		u, err := url.Parse(tc.self)
		if err != nil {
			t.Fatal(err)
		}
		if got := DialAddr(u); got != tc.want {
			t.Errorf("DialAddr(%s) = %s, want %s", tc.self, got, tc.want)
		}
	}
}

func TestTakeHolder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		values   []string
		hops     int
		want     string
		wantOK   bool
		wantKept bool
	}{
		{name: "entry box learns and strips", values: []string{"https://Box2.example.net"}, want: "https://box2.example.net", wantOK: true},
		{name: "inner hop learns and passes it back", values: []string{"https://box2.example.net"}, hops: 1, want: "https://box2.example.net", wantOK: true, wantKept: true},
		{name: "none", values: nil},
		{name: "two values teach nothing", values: []string{"https://a.example.net", "https://b.example.net"}, hops: 1, wantKept: true},
		{name: "malformed teaches nothing", values: []string{"ftp://x"}},
		{name: "malformed stripped only at the entry", values: []string{"https://x/path"}, hops: 2, wantKept: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tc.values {
				h.Add(HolderHeader, v)
			}
			got, ok := TakeHolder(h, tc.hops)
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("TakeHolder = %q, %v; want %q, %v", got, ok, tc.want, tc.wantOK)
			}
			if kept := len(h.Values(HolderHeader)) > 0; kept != tc.wantKept && len(tc.values) > 0 {
				t.Fatalf("header kept = %v, want %v", kept, tc.wantKept)
			}
		})
	}
}
