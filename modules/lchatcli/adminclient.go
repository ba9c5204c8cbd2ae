package lchatcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	"github.com/lchat/lchat-caddy/internal/cli"
)

// adminCall sends one request to the admin API and decodes a JSON answer into out.
func adminCall(fs caddycmd.Flags, method, uri string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	resp, err := adminRequest(fs, method, uri, rd)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading the admin API's answer: %v", err)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decoding the admin API's answer: %v", err)
		}
	}
	return nil
}

// adminRequest sends one request to the admin API the flags select (adminAddress), as
// caddycmd.AdminAPIRequest does (the Origin the admin API checks; Unix sockets), but
// with errors a person can act on: an address that does not parse is a usage error, a
// connection that cannot be made is cli.Unreachable, and an error answer is the
// server's own message. The caller closes the body of a 2xx or 3xx answer.
func adminRequest(fs caddycmd.Flags, method, uri string, body io.Reader) (*http.Response, error) {
	addr, err := adminAddress(fs)
	if err != nil {
		return nil, cli.Usagef("finding the admin address: %v", err)
	}
	na, err := caddy.ParseNetworkAddress(addr)
	if err != nil || na.PortRangeSize() > 1 {
		return nil, cli.Usagef("invalid admin address %q (want host:port or unix//path)", addr)
	}
	origin := "http://" + na.JoinHostPort(0)
	if na.IsUnixNetwork() || na.IsFdNetwork() {
		// Any Host does for a socket; the admin API accepts 127.0.0.1.
		origin = "http://127.0.0.1"
		// A Unix address may carry the socket's permission bits: unix//path|0600.
		na.Host, _, _ = strings.Cut(na.Host, "|")
	}
	req, err := http.NewRequest(method, origin+uri, body)
	if err != nil {
		return nil, fmt.Errorf("making the request: %v", err)
	}
	if !na.IsUnixNetwork() && !na.IsFdNetwork() {
		req.Header.Set("Origin", origin)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	var dialErr error
	client := http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, na.Network, na.JoinHostPort(0))
			dialErr = err
			return c, err
		},
	}}
	resp, err := client.Do(req)
	if err != nil {
		if dialErr != nil {
			return nil, cli.Unreachable(fmt.Errorf("cannot reach the admin API at %s: %v (is lchat-caddy running there? --address or $LCHAT_ADMIN_LISTEN selects it)", addr, dialErr))
		}
		return nil, fmt.Errorf("calling the admin API at %s: %v", addr, err)
	}
	if resp.StatusCode < 400 {
		return resp, nil
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var apiErr struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(data, &apiErr) == nil && apiErr.Error != "" {
		return nil, errors.New(apiErr.Error)
	}
	if msg := strings.TrimSpace(string(data)); msg != "" {
		return nil, fmt.Errorf("the admin API answered %s: %s", resp.Status, msg)
	}
	return nil, fmt.Errorf("the admin API answered %s", resp.Status)
}
