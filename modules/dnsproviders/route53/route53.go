// Package route53 is the dns.providers.route53 Caddy module: a thin wrapper around
// github.com/libdns/route53 that solves ACME DNS-01 challenges and moves A records
// for relocation. It authenticates with the box's own AWS credentials chain (instance
// role, environment, shared config), so no DNS token has to sit on disk.
package route53

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	r53 "github.com/aws/aws-sdk-go-v2/service/route53"
	r53types "github.com/aws/aws-sdk-go-v2/service/route53/types"
	"github.com/caddyserver/caddy/v2"
	"github.com/libdns/libdns"
	libdnsroute53 "github.com/libdns/route53"
)

func init() {
	caddy.RegisterModule(Provider{})
}

// defaultRegion is where Route53, a global service, signs requests in the aws partition.
const defaultRegion = "us-east-1"

// callTimeout bounds one call of the provider, its retries included (plus max_wait
// with wait_for_sync): certmagic gives DNS-01 calls no deadline of their own, and
// a hung API request would hold the fleet's issuance lock.
const callTimeout = 2 * time.Minute

// Provider manages DNS records in one Route53 hosted zone.
type Provider struct {
	// HostedZoneID is the hosted zone to change, without the "/hostedzone/" prefix.
	// Default: looked up from the zone name on every call (needs route53:ListHostedZonesByName).
	HostedZoneID string `json:"hosted_zone_id,omitempty"`

	// Region signs the requests. Default: AWS_REGION, else us-east-1.
	Region string `json:"region,omitempty"`

	// Profile is a shared-config profile. Default: AWS_PROFILE, else the default chain.
	Profile string `json:"profile,omitempty"`

	// AccessKeyID, SecretAccessKey and SessionToken set static credentials. Default:
	// the standard AWS credentials chain, which is what a box should use.
	AccessKeyID     string `json:"access_key_id,omitempty"`
	SecretAccessKey string `json:"secret_access_key,omitempty"`
	SessionToken    string `json:"session_token,omitempty"`

	// MaxRetries bounds the SDK's retries of one request. Default: 5.
	MaxRetries int `json:"max_retries,omitempty"`

	// WaitForSync waits until Route53 reports a change INSYNC before returning.
	// Default: false.
	WaitForSync bool `json:"wait_for_sync,omitempty"`

	// MaxWait bounds WaitForSync. Default: 1m.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`

	// timeout bounds each call: callTimeout, plus MaxWait with WaitForSync.
	timeout time.Duration

	// mu serializes calls into the libdns provider, whose lazy client set-up is not
	// safe for concurrent first use.
	mu       *sync.Mutex
	provider *libdnsroute53.Provider
	// client makes the requests the libdns provider cannot (see AppendRecords).
	client *r53.Client
}

// CaddyModule returns the Caddy module information.
func (Provider) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "dns.providers.route53",
		New: func() caddy.Module { return new(Provider) },
	}
}

// Provision expands placeholders, applies defaults and checks that the AWS
// configuration loads, so a bad profile stops start-up instead of the libdns
// provider's log.Fatalf at the first challenge.
func (p *Provider) Provision(ctx caddy.Context) error {
	p.mu = new(sync.Mutex)
	repl := caddy.NewReplacer()
	for _, f := range []*string{&p.HostedZoneID, &p.Region, &p.Profile, &p.AccessKeyID, &p.SecretAccessKey, &p.SessionToken} {
		*f = repl.ReplaceAll(*f, "")
	}
	p.HostedZoneID = strings.TrimPrefix(p.HostedZoneID, "/hostedzone/")
	if p.Region == "" && os.Getenv("AWS_REGION") == "" && os.Getenv("AWS_DEFAULT_REGION") == "" {
		p.Region = defaultRegion
	}
	if p.MaxRetries == 0 {
		p.MaxRetries = 5
	}
	if p.MaxWait == 0 {
		p.MaxWait = caddy.Duration(time.Minute)
	}
	p.timeout = callTimeout
	if p.WaitForSync {
		p.timeout += time.Duration(p.MaxWait)
	}
	if (p.AccessKeyID == "") != (p.SecretAccessKey == "") {
		return fmt.Errorf("route53: access_key_id and secret_access_key must be set together")
	}

	var opts []func(*config.LoadOptions) error
	if p.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(p.Profile))
	}
	if p.Region != "" {
		opts = append(opts, config.WithRegion(p.Region))
	}
	if p.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(p.AccessKeyID, p.SecretAccessKey, p.SessionToken)))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return fmt.Errorf("route53: loading AWS configuration: %v", p.scrub(err))
	}
	p.client = r53.NewFromConfig(cfg, func(o *r53.Options) {
		o.Retryer = retry.AddWithMaxAttempts(retry.NewStandard(), p.MaxRetries)
	})

	p.provider = &libdnsroute53.Provider{
		HostedZoneID:       p.HostedZoneID,
		Region:             p.Region,
		Profile:            p.Profile,
		AccessKeyId:        p.AccessKeyID,
		SecretAccessKey:    p.SecretAccessKey,
		SessionToken:       p.SessionToken,
		MaxRetries:         p.MaxRetries,
		WaitForRoute53Sync: p.WaitForSync,
		Route53MaxWait:     time.Duration(p.MaxWait),
	}
	return nil
}

// GetRecords lists the records of zone.
func (p *Provider) GetRecords(ctx context.Context, zone string) ([]libdns.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	recs, err := p.provider.GetRecords(ctx, zone)
	return recs, p.wrap("listing records", zone, err)
}

// AppendRecords adds records to zone (DNS-01 puts its TXT record this way). The
// libdns provider CREATEs a single record's set, which Route53 refuses when the
// name already has a set of that type: a TXT value left behind by a box killed
// mid-challenge, or another pending challenge for the same name. Then the value
// is added to the existing set instead, so a leftover never blocks issuance.
func (p *Provider) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	out, err := p.provider.AppendRecords(ctx, zone, recs)
	if err != nil && len(recs) == 1 && setExists(err) {
		if err = p.addToSet(ctx, zone, recs[0]); err == nil {
			out = recs
		}
	}
	return out, p.wrap("appending records", zone, err)
}

// SetRecords replaces the record sets named by recs (relocation moves an A record this way).
func (p *Provider) SetRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	out, err := p.provider.SetRecords(ctx, zone, recs)
	return out, p.wrap("setting records", zone, err)
}

// DeleteRecords removes recs from zone.
func (p *Provider) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	out, err := p.provider.DeleteRecords(ctx, zone, recs)
	return out, p.wrap("deleting records", zone, err)
}

func (p *Provider) wrap(op, zone string, err error) error {
	if err == nil {
		return nil
	}
	// The SDK puts a rejected change batch's reasons in Messages, not in the
	// error text, which only says "ChangeBatch errors occurred".
	var icb *r53types.InvalidChangeBatch
	if errors.As(err, &icb) && len(icb.Messages) > 0 {
		err = fmt.Errorf("%v %q", err, icb.Messages)
	}
	return fmt.Errorf("route53: %s in zone %s: %v", op, zone, p.scrub(err))
}

// scrub removes configured secrets from an error's text: errors end up in logs.
func (p *Provider) scrub(err error) error {
	msg := err.Error()
	for _, s := range []string{p.SecretAccessKey, p.SessionToken} {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
		}
	}
	if msg == err.Error() {
		return err
	}
	return fmt.Errorf("%s", msg)
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
