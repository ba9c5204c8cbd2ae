package proxyprotocol

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lchat/lchat-caddy/proxyproto"
)

func TestCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		in, err string
		allow   []string
		timeout time.Duration
	}{
		{in: "lchat_proxy_protocol {\n allow 10.0.0.0/16 192.0.2.7\n allow 10.1.0.0/16\n timeout 2s\n}",
			allow: []string{"10.0.0.0/16", "192.0.2.7", "10.1.0.0/16"}, timeout: 2 * time.Second},
		{in: "lchat_proxy_protocol {\n allow\n}"},
		{in: "lchat_proxy_protocol"},
		{in: "lchat_proxy_protocol 10.0.0.1", err: "wrong argument count"},
		{in: "lchat_proxy_protocol {\n timeout\n}", err: "wrong argument count"},
		{in: "lchat_proxy_protocol {\n timeout soon\n}", err: `parsing timeout "soon"`},
		{in: "lchat_proxy_protocol {\n trust 10.0.0.1\n}", err: "unrecognized subdirective trust"},
	} {
		var w Wrapper
		err := w.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.err == "" && (strings.Join(w.Allow, " ") != strings.Join(tc.allow, " ") || time.Duration(w.Timeout) != tc.timeout):
			t.Errorf("%q: allow %v timeout %v", tc.in, w.Allow, time.Duration(w.Timeout))
		}
	}
}

func provision(t *testing.T, w *Wrapper) error {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return w.Provision(ctx)
}

func TestProvision(t *testing.T) {
	w := &Wrapper{Allow: []string{"10.0.0.0/16, 192.0.2.7", "2001:db8::/32"}}
	if err := provision(t, w); err != nil {
		t.Fatal(err)
	}
	if len(w.allow) != 3 || time.Duration(w.Timeout) != proxyproto.DefaultTimeout {
		t.Fatalf("allow %v timeout %v", w.allow, w.Timeout)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, ok := w.WrapListener(l).(*proxyproto.Listener); !ok {
		t.Fatal("the listener was not wrapped")
	}
	// An empty allow (an unset variable) reads no header from anyone: the listener as it was.
	empty := &Wrapper{Allow: []string{""}}
	if err := provision(t, empty); err != nil {
		t.Fatal(err)
	}
	if empty.WrapListener(l) != l {
		t.Fatal("an empty allow wrapped the listener")
	}
	for spec, want := range map[string]string{
		"10.0.0.300":   `allow: "10.0.0.300" is neither an IP address nor a CIDR prefix`,
		"balancer.lan": `allow: "balancer.lan" is neither`,
	} {
		if err := provision(t, &Wrapper{Allow: []string{spec}}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("allow %q: %v, want %q", spec, err, want)
		}
	}
	if err := provision(t, &Wrapper{Timeout: -1}); err == nil {
		t.Error("a negative timeout was accepted")
	}
}
