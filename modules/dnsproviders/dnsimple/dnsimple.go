// Package dnsimple is the dns.providers.dnsimple Caddy module: a thin wrapper around
// github.com/libdns/dnsimple that solves ACME DNS-01 challenges and moves A records
// for relocation. It is the default provider of the shipped Caddyfiles.
package dnsimple

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	dnsimpleapi "github.com/dnsimple/dnsimple-go/v8/dnsimple"
	libdnsdnsimple "github.com/libdns/dnsimple"
	"github.com/libdns/libdns"
)

func init() {
	caddy.RegisterModule(Provider{})
}

// callTimeout bounds one call of the provider, every API request it makes included.
const callTimeout = 2 * time.Minute

// Provider manages DNS records through the DNSimple API v2.
type Provider struct {
	// APIAccessToken is an account (or user) API token. Required; usually
	// "{env.DNSIMPLE_API_TOKEN}" or a file placeholder.
	APIAccessToken string `json:"api_access_token,omitempty"`

	// AccountID is the numeric account the zones belong to. Default: the account
	// of an account token, asked once from /v2/whoami. User tokens must set it.
	AccountID string `json:"account_id,omitempty"`

	// APIURL is the API's base URL. Default: https://api.dnsimple.com
	// (https://api.sandbox.dnsimple.com for the sandbox).
	APIURL string `json:"api_url,omitempty"`

	// timeout bounds each call: certmagic gives DNS-01 calls no deadline of their
	// own, and a hung API request would hold the fleet's issuance lock.
	timeout time.Duration

	// mu guards provider and its lazy account lookup; the libdns provider itself
	// serializes its calls too.
	mu       *sync.Mutex
	provider *libdnsdnsimple.Provider
	client   *dnsimpleapi.Client
	account  string
}

// CaddyModule returns the Caddy module information.
func (Provider) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "dns.providers.dnsimple",
		New: func() caddy.Module { return new(Provider) },
	}
}

// Provision expands placeholders and checks the configuration.
func (p *Provider) Provision(ctx caddy.Context) error {
	p.mu = new(sync.Mutex)
	p.timeout = callTimeout
	repl := caddy.NewReplacer()
	p.APIAccessToken = strings.TrimSpace(repl.ReplaceAll(p.APIAccessToken, ""))
	p.AccountID = repl.ReplaceAll(p.AccountID, "")
	p.APIURL = strings.TrimRight(repl.ReplaceAll(p.APIURL, ""), "/")
	if p.APIAccessToken == "" {
		return fmt.Errorf("dnsimple: api_access_token is required")
	}
	if p.AccountID != "" {
		if _, err := strconv.ParseInt(p.AccountID, 10, 64); err != nil {
			return fmt.Errorf("dnsimple: account_id %q is not a number", p.AccountID)
		}
	}
	return nil
}

// libdnsProvider returns the wrapped provider, resolving the account first. The
// libdns provider does its own whoami but ignores its error (and then dereferences a
// nil response), so an unreachable API or a bad token would crash the process.
func (p *Provider) libdnsProvider(ctx context.Context) (*libdnsdnsimple.Provider, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.provider != nil {
		return p.provider, nil
	}
	// The client's context only scopes its token source; requests carry their own.
	c := dnsimpleapi.NewClient(dnsimpleapi.StaticTokenHTTPClient(context.Background(), p.APIAccessToken))
	c.UserAgent = "lchat-caddy"
	if p.APIURL != "" {
		c.BaseURL = p.APIURL
	}
	account := p.AccountID
	if account == "" {
		resp, err := c.Identity.Whoami(ctx)
		if err != nil {
			return nil, fmt.Errorf("asking whoami for the account id: %v", p.scrub(err))
		}
		if resp.Data == nil || resp.Data.Account == nil {
			return nil, fmt.Errorf("the token is not an account token: set account_id")
		}
		account = strconv.FormatInt(resp.Data.Account.ID, 10)
	}
	p.client, p.account = c, account
	p.provider = &libdnsdnsimple.Provider{
		APIAccessToken: p.APIAccessToken,
		AccountID:      account,
		APIURL:         p.APIURL,
	}
	return p.provider, nil
}

// bound gives ctx the provider's per-call deadline.
func (p *Provider) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.timeout)
}

// GetRecords lists the records of zone, every page of them. Records the libdns
// types cannot represent are left out (the libdns provider returns them as nil
// entries, and reads only the first page).
func (p *Provider) GetRecords(ctx context.Context, zone string) ([]libdns.Record, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	if _, err := p.libdnsProvider(ctx); err != nil {
		return nil, p.wrap("listing records", zone, err)
	}
	var recs []libdns.Record
	opts := &dnsimpleapi.ZoneRecordListOptions{}
	for {
		resp, err := p.client.Zones.ListRecords(ctx, p.account, strings.TrimSuffix(zone, "."), opts)
		if err != nil {
			return nil, p.wrap("listing records", zone, err)
		}
		for _, r := range resp.Data {
			rec, err := libdns.RR{Name: r.Name, Type: r.Type, Data: r.Content, TTL: time.Duration(r.TTL) * time.Second}.Parse()
			if err == nil {
				recs = append(recs, rec)
			}
		}
		if !nextPage(resp.Pagination, opts) {
			return recs, nil
		}
	}
}

// AppendRecords adds records to zone (DNS-01 puts its TXT record this way).
func (p *Provider) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	lp, err := p.libdnsProvider(ctx)
	if err != nil {
		return nil, p.wrap("appending records", zone, err)
	}
	out, err := lp.AppendRecords(ctx, zone, recs)
	return out, p.wrap("appending records", zone, err)
}

// SetRecords creates or updates the records named by recs (relocation moves an A
// record this way). The existing record is found by exact name and type; the
// libdns provider matches names by substring and could rewrite "x8oe" for "8oe".
func (p *Provider) SetRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	if _, err := p.libdnsProvider(ctx); err != nil {
		return nil, p.wrap("setting records", zone, err)
	}
	zoneName := strings.TrimSuffix(zone, ".")
	var set []libdns.Record
	for _, r := range recs {
		rr := r.RR()
		name, typ := rr.Name, rr.Type
		if name == "@" {
			name = ""
		}
		attrs := dnsimpleapi.ZoneRecordAttributes{Type: typ, Name: &name, Content: rr.Data, TTL: int(rr.TTL.Seconds())}
		resp, err := p.client.Zones.ListRecords(ctx, p.account, zoneName, &dnsimpleapi.ZoneRecordListOptions{Name: &name, Type: &typ})
		if err != nil {
			return set, p.wrap("setting records", zone, err)
		}
		var existing []dnsimpleapi.ZoneRecord
		for _, e := range resp.Data {
			if e.Name == name && e.Type == typ {
				existing = append(existing, e)
			}
		}
		if len(existing) == 0 {
			if _, err := p.client.Zones.CreateRecord(ctx, p.account, zoneName, attrs); err != nil {
				return set, p.wrap("setting records", zone, err)
			}
		} else {
			// One value replaces the set: update the first, drop the rest.
			if _, err := p.client.Zones.UpdateRecord(ctx, p.account, zoneName, existing[0].ID, attrs); err != nil {
				return set, p.wrap("setting records", zone, err)
			}
			for _, e := range existing[1:] {
				if _, err := p.client.Zones.DeleteRecord(ctx, p.account, zoneName, e.ID); err != nil {
					return set, p.wrap("setting records", zone, err)
				}
			}
		}
		set = append(set, r)
	}
	return set, nil
}

// DeleteRecords removes recs from zone. A record is matched by name, type and
// content: DNS-01 for a name and its wildcard puts two TXT values on one name, and
// deleting by name alone (as the libdns provider does) could remove the value a
// pending validation still needs. Records that are not there are skipped.
func (p *Provider) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	if _, err := p.libdnsProvider(ctx); err != nil {
		return nil, p.wrap("deleting records", zone, err)
	}
	zoneName := strings.TrimSuffix(zone, ".")
	var deleted []libdns.Record
	for _, r := range recs {
		rr := r.RR()
		name, typ := rr.Name, rr.Type
		if name == "@" {
			name = ""
		}
		opts := &dnsimpleapi.ZoneRecordListOptions{Name: &name, Type: &typ}
		for {
			resp, err := p.client.Zones.ListRecords(ctx, p.account, zoneName, opts)
			if err != nil {
				return deleted, p.wrap("deleting records", zone, err)
			}
			for _, existing := range resp.Data {
				if existing.Name != name || existing.Type != typ || !sameContent(existing.Content, rr.Data) {
					continue
				}
				if _, err := p.client.Zones.DeleteRecord(ctx, p.account, zoneName, existing.ID); err != nil {
					return deleted, p.wrap("deleting records", zone, err)
				}
				deleted = append(deleted, r)
			}
			if !nextPage(resp.Pagination, opts) {
				break
			}
		}
	}
	return deleted, nil
}

// nextPage points opts at the page after p, and reports false when p was the last.
func nextPage(p *dnsimpleapi.Pagination, opts *dnsimpleapi.ZoneRecordListOptions) bool {
	if p == nil || p.CurrentPage >= p.TotalPages {
		return false
	}
	page := p.CurrentPage + 1
	opts.Page = &page
	return true
}

// sameContent compares record contents, ignoring the quotes DNSimple may put
// around TXT data.
func sameContent(a, b string) bool {
	return a == b || strings.Trim(a, `"`) == strings.Trim(b, `"`)
}

func (p *Provider) wrap(op, zone string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("dnsimple: %s in zone %s: %v", op, zone, p.scrub(err))
}

// scrub removes the token from an error's text: errors end up in logs.
func (p *Provider) scrub(err error) error {
	if p.APIAccessToken == "" || !strings.Contains(err.Error(), p.APIAccessToken) {
		return err
	}
	return fmt.Errorf("%s", strings.ReplaceAll(err.Error(), p.APIAccessToken, "[redacted]"))
}

// Interface guards
var (
	_ caddy.Module          = (*Provider)(nil)
	_ caddy.Provisioner     = (*Provider)(nil)
	_ libdns.RecordGetter   = (*Provider)(nil)
	_ libdns.RecordAppender = (*Provider)(nil)
	_ libdns.RecordSetter   = (*Provider)(nil)
	_ libdns.RecordDeleter  = (*Provider)(nil)
)
