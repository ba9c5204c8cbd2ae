// Package testdns is dns.providers.lchat_challtestsrv, a DNS provider for tests only:
// it writes TXT (and A) records into pebble-challtestsrv through its management API,
// so end-to-end tests can obtain certificates from pebble by DNS-01 without a real
// DNS provider. It is not imported by the shipped binary.
package testdns

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/libdns/libdns"
)

func init() {
	caddy.RegisterModule(Provider{})
}

// Provider talks to pebble-challtestsrv's management API.
type Provider struct {
	// ManagementURL is challtestsrv's management endpoint, e.g. http://127.0.0.1:8055.
	// Required.
	ManagementURL string `json:"management_url,omitempty"`

	// mu guards txt, the TXT values this provider set per host: challtestsrv can
	// only clear every value of a host, so a delete re-adds the others.
	mu  *sync.Mutex
	txt map[string][]string
}

// CaddyModule returns the Caddy module information.
func (Provider) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "dns.providers.lchat_challtestsrv",
		New: func() caddy.Module { return new(Provider) },
	}
}

// Provision expands placeholders and checks the URL.
func (p *Provider) Provision(caddy.Context) error {
	p.ManagementURL = strings.TrimRight(caddy.NewReplacer().ReplaceAll(p.ManagementURL, ""), "/")
	if p.ManagementURL == "" {
		return fmt.Errorf("lchat_challtestsrv: management_url is required")
	}
	p.mu = new(sync.Mutex)
	p.txt = map[string][]string{}
	return nil
}

// AppendRecords adds TXT and A records.
func (p *Provider) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []libdns.Record
	for _, r := range recs {
		rr := r.RR()
		host := libdns.AbsoluteName(rr.Name, zone)
		switch rr.Type {
		case "TXT":
			if err := p.post(ctx, "/set-txt", map[string]any{"host": host, "value": rr.Data}); err != nil {
				return out, err
			}
			p.txt[host] = append(p.txt[host], rr.Data)
		case "A":
			if err := p.post(ctx, "/add-a", map[string]any{"host": host, "addresses": []string{rr.Data}}); err != nil {
				return out, err
			}
		default:
			return out, fmt.Errorf("lchat_challtestsrv: record type %s not supported", rr.Type)
		}
		out = append(out, r)
	}
	return out, nil
}

// DeleteRecords removes TXT records (by value) and A records (every address of the host).
func (p *Provider) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []libdns.Record
	for _, r := range recs {
		rr := r.RR()
		host := libdns.AbsoluteName(rr.Name, zone)
		switch rr.Type {
		case "TXT":
			if err := p.post(ctx, "/clear-txt", map[string]any{"host": host}); err != nil {
				return out, err
			}
			var keep []string
			for _, v := range p.txt[host] {
				if v != rr.Data {
					keep = append(keep, v)
				}
			}
			p.txt[host] = keep
			for _, v := range keep {
				if err := p.post(ctx, "/set-txt", map[string]any{"host": host, "value": v}); err != nil {
					return out, err
				}
			}
		case "A":
			if err := p.post(ctx, "/clear-a", map[string]any{"host": host}); err != nil {
				return out, err
			}
		default:
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

func (p *Provider) post(ctx context.Context, path string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.ManagementURL+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("lchat_challtestsrv: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("lchat_challtestsrv: posting %s: %v", path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("lchat_challtestsrv: %s: %s %s", path, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// UnmarshalCaddyfile sets up the provider from Caddyfile tokens.
//
// Syntax:
//
//	lchat_challtestsrv [<management_url>] {
//	    management_url <url>
//	}
func (p *Provider) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		p.ManagementURL = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "management_url":
			if !d.NextArg() {
				return d.ArgErr()
			}
			p.ManagementURL = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Provider)(nil)
	_ caddyfile.Unmarshaler = (*Provider)(nil)
	_ libdns.RecordAppender = (*Provider)(nil)
	_ libdns.RecordDeleter  = (*Provider)(nil)
)
