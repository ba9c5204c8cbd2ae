package route53

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/libdns/libdns"
)

const (
	testKeyID  = "AKIDLCHATTEST"
	testSecret = "s3cr3t-never-in-output"
	zoneID     = "Z0123456789"
)

// fakeRoute53 replays the Route53 REST-XML API (2013-04-01) for one hosted zone:
// ListHostedZonesByName, ListResourceRecordSets and ChangeResourceRecordSets, with the
// error documents Route53 sends. It records every request it saw.
type fakeRoute53 struct {
	t    *testing.T
	zone string // "example.com."

	mu       sync.Mutex
	sets     map[string][]string // name+" "+type -> values
	ttls     map[string]int64
	requests []string // "METHOD path?query"
	authz    []string
	failNext string // an error code to answer the next change with
}

type xmlRRSet struct {
	Name            string   `xml:"Name"`
	Type            string   `xml:"Type"`
	TTL             int64    `xml:"TTL"`
	ResourceRecords []string `xml:"ResourceRecords>ResourceRecord>Value"`
}

type changeBatchRequest struct {
	XMLName xml.Name `xml:"ChangeResourceRecordSetsRequest"`
	Changes []struct {
		Action string   `xml:"Action"`
		Set    xmlRRSet `xml:"ResourceRecordSet"`
	} `xml:"ChangeBatch>Changes>Change"`
}

func (f *fakeRoute53) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
	f.authz = append(f.authz, r.Header.Get("Authorization"))
	body, _ := io.ReadAll(r.Body)
	if strings.Contains(string(body), testSecret) {
		f.t.Errorf("request body carries the secret key")
	}
	w.Header().Set("Content-Type", "text/xml")
	const ns = `xmlns="https://route53.amazonaws.com/doc/2013-04-01/"`
	zonePath := "/2013-04-01/hostedzone/" + zoneID + "/rrset"
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/2013-04-01/hostedzonesbyname":
		fmt.Fprintf(w, `<?xml version="1.0"?><ListHostedZonesByNameResponse %s><HostedZones>`+
			`<HostedZone><Id>/hostedzone/%s</Id><Name>%s</Name><CallerReference>x</CallerReference>`+
			`<Config><PrivateZone>false</PrivateZone></Config><ResourceRecordSetCount>2</ResourceRecordSetCount></HostedZone>`+
			`</HostedZones><DNSName>%s</DNSName><IsTruncated>false</IsTruncated><MaxItems>1</MaxItems></ListHostedZonesByNameResponse>`,
			ns, zoneID, f.zone, r.URL.Query().Get("dnsname"))
	case strings.HasPrefix(r.URL.Path, "/2013-04-01/hostedzone/") && !strings.HasPrefix(r.URL.Path, zonePath):
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `<?xml version="1.0"?><ErrorResponse %s><Error><Type>Sender</Type><Code>NoSuchHostedZone</Code>`+
			`<Message>No hosted zone found with ID: %s</Message></Error><RequestId>r1</RequestId></ErrorResponse>`, ns, r.URL.Path)
	case r.Method == http.MethodGet && strings.TrimSuffix(r.URL.Path, "/") == zonePath:
		fmt.Fprintf(w, `<?xml version="1.0"?><ListResourceRecordSetsResponse %s><ResourceRecordSets>`, ns)
		for k, vals := range f.sets {
			name, typ, _ := strings.Cut(k, " ")
			fmt.Fprintf(w, `<ResourceRecordSet><Name>%s</Name><Type>%s</Type><TTL>%d</TTL><ResourceRecords>`, name, typ, f.ttls[k])
			for _, v := range vals {
				var esc strings.Builder
				_ = xml.EscapeText(&esc, []byte(v))
				fmt.Fprintf(w, `<ResourceRecord><Value>%s</Value></ResourceRecord>`, esc.String())
			}
			fmt.Fprint(w, `</ResourceRecords></ResourceRecordSet>`)
		}
		fmt.Fprint(w, `</ResourceRecordSets><IsTruncated>false</IsTruncated><MaxItems>1000</MaxItems></ListResourceRecordSetsResponse>`)
	case r.Method == http.MethodPost && strings.TrimSuffix(r.URL.Path, "/") == zonePath:
		var req changeBatchRequest
		if err := xml.Unmarshal(body, &req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `<ErrorResponse %s><Error><Type>Sender</Type><Code>MalformedInput</Code><Message>%v</Message></Error></ErrorResponse>`, ns, err)
			return
		}
		if f.failNext != "" {
			code := f.failNext
			f.failNext = ""
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `<?xml version="1.0"?><ErrorResponse %s><Error><Type>Sender</Type><Code>%s</Code>`+
				`<Message>rejected by the test</Message></Error><RequestId>r2</RequestId></ErrorResponse>`, ns, code)
			return
		}
		for _, c := range req.Changes {
			k := c.Set.Name + " " + c.Set.Type
			switch c.Action {
			case "CREATE":
				if _, ok := f.sets[k]; ok {
					w.WriteHeader(http.StatusBadRequest)
					fmt.Fprintf(w, `<?xml version="1.0"?><InvalidChangeBatch %s><Messages><Message>Tried to create resource record set [name='%s', type='%s'] but it already exists</Message></Messages></InvalidChangeBatch>`, ns, c.Set.Name, c.Set.Type)
					return
				}
				f.sets[k] = c.Set.ResourceRecords
				f.ttls[k] = c.Set.TTL
			case "UPSERT":
				f.sets[k] = c.Set.ResourceRecords
				f.ttls[k] = c.Set.TTL
			case "DELETE":
				delete(f.sets, k)
			}
		}
		fmt.Fprintf(w, `<?xml version="1.0"?><ChangeResourceRecordSetsResponse %s><ChangeInfo><Id>/change/C1</Id>`+
			`<Status>PENDING</Status><SubmittedAt>2026-01-01T00:00:00Z</SubmittedAt></ChangeInfo></ChangeResourceRecordSetsResponse>`, ns)
	default:
		f.t.Errorf("unexpected request %s %s", r.Method, r.URL)
		w.WriteHeader(http.StatusNotImplemented)
	}
}

func (f *fakeRoute53) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.requests
	f.requests = nil
	return out
}

// awsEnv points the SDK's default chain at the fake server and at static test
// credentials, isolated from any AWS configuration on the machine.
func awsEnv(t *testing.T, url string) {
	dir := t.TempDir()
	t.Setenv("AWS_ENDPOINT_URL_ROUTE_53", url)
	t.Setenv("AWS_ACCESS_KEY_ID", testKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", testSecret)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

func newFake(t *testing.T) (*fakeRoute53, *httptest.Server) {
	f := &fakeRoute53{t: t, zone: "example.com.", sets: map[string][]string{}, ttls: map[string]int64{}}
	f.sets["example.com. SOA"] = []string{"ns-1.awsdns-00.com. hostmaster.example.com. 1 7200 900 1209600 86400"}
	f.sets["example.com. NS"] = []string{"ns-1.awsdns-00.com."}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	awsEnv(t, srv.URL)
	return f, srv
}

func provision(t *testing.T, p *Provider) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := p.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
}

func TestDNS01TXTAppendAndDelete(t *testing.T) {
	for _, tc := range []struct {
		name      string
		zoneID    string
		wantQuery bool
	}{
		{"zone looked up by name", "", true},
		{"hosted zone id given", zoneID, false},
		{"hosted zone id with prefix", "/hostedzone/" + zoneID, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := newFake(t)
			p := &Provider{HostedZoneID: tc.zoneID, MaxRetries: 1}
			provision(t, p)
			ctx := context.Background()
			txt := libdns.TXT{Name: "_acme-challenge", Text: "token-value-1", TTL: 60 * time.Second}

			out, err := p.AppendRecords(ctx, "example.com.", []libdns.Record{txt})
			if err != nil {
				t.Fatalf("append: %v", err)
			}
			if len(out) != 1 {
				t.Fatalf("append returned %d records, want 1", len(out))
			}
			reqs := f.take()
			lookedUp := false
			for _, r := range reqs {
				if strings.HasPrefix(r, "GET /2013-04-01/hostedzonesbyname?") {
					lookedUp = true
					if !strings.Contains(r, "dnsname=example.com.") {
						t.Errorf("zone lookup %q does not ask for example.com.", r)
					}
				}
			}
			if lookedUp != tc.wantQuery {
				t.Errorf("zone lookup request made = %v, want %v (requests %v)", lookedUp, tc.wantQuery, reqs)
			}
			if last := reqs[len(reqs)-1]; !strings.HasPrefix(last, "POST /2013-04-01/hostedzone/"+zoneID+"/rrset") {
				t.Errorf("append ended with %q, want a change batch on the zone", last)
			}
			f.mu.Lock()
			got := f.sets["_acme-challenge.example.com. TXT"]
			ttl := f.ttls["_acme-challenge.example.com. TXT"]
			f.mu.Unlock()
			if len(got) != 1 || got[0] != `"token-value-1"` || ttl != 60 {
				t.Fatalf("TXT record set = %q ttl %d, want one quoted value with ttl 60", got, ttl)
			}

			if _, err := p.DeleteRecords(ctx, "example.com.", []libdns.Record{txt}); err != nil {
				t.Fatalf("delete: %v", err)
			}
			f.mu.Lock()
			_, still := f.sets["_acme-challenge.example.com. TXT"]
			f.mu.Unlock()
			if still {
				t.Fatal("TXT record still present after delete")
			}
			for _, a := range f.authz {
				if !strings.HasPrefix(a, "AWS4-HMAC-SHA256 Credential="+testKeyID+"/") || !strings.Contains(a, "/us-east-1/route53/aws4_request") {
					t.Errorf("Authorization %q is not SigV4 for route53 in us-east-1 with the chain's key", a)
				}
				if strings.Contains(a, testSecret) {
					t.Error("Authorization header carries the secret")
				}
			}
		})
	}
}

func TestARecordSetForRelocation(t *testing.T) {
	f, _ := newFake(t)
	p := &Provider{HostedZoneID: zoneID, MaxRetries: 1}
	provision(t, p)
	ctx := context.Background()
	set := func(ip string) {
		t.Helper()
		a, err := libdns.RR{Name: "8oe", Type: "A", Data: ip, TTL: 300 * time.Second}.Parse()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.SetRecords(ctx, "example.com.", []libdns.Record{a}); err != nil {
			t.Fatalf("set A %s: %v", ip, err)
		}
	}
	set("192.0.2.10")
	set("198.51.100.7") // the move: replaces, never adds a second address
	f.mu.Lock()
	got := f.sets["8oe.example.com. A"]
	f.mu.Unlock()
	if len(got) != 1 || got[0] != "198.51.100.7" {
		t.Fatalf("A record set = %v, want exactly the new address", got)
	}
	recs, err := p.GetRecords(ctx, "example.com.")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range recs {
		rr := r.RR()
		if rr.Type == "A" && rr.Name == "8oe" && rr.Data == "198.51.100.7" {
			found = true
		}
	}
	if !found {
		t.Fatalf("GetRecords does not show the moved A record: %v", recs)
	}
}

func TestErrorsAreReportedWithoutSecrets(t *testing.T) {
	f, _ := newFake(t)
	txt := libdns.TXT{Name: "_acme-challenge", Text: "v"}

	// A zone id the API does not know.
	p := &Provider{HostedZoneID: "ZWRONG", MaxRetries: 1, AccessKeyID: testKeyID, SecretAccessKey: testSecret}
	provision(t, p)
	_, err := p.AppendRecords(context.Background(), "example.com.", []libdns.Record{txt})
	if err == nil || !strings.Contains(err.Error(), "NoSuchHostedZone") {
		t.Fatalf("append to an unknown zone: err = %v, want NoSuchHostedZone", err)
	}
	if strings.Contains(err.Error(), testSecret) {
		t.Fatal("error text carries the secret key")
	}

	// The API rejects the change.
	p = &Provider{HostedZoneID: zoneID, MaxRetries: 1}
	provision(t, p)
	f.mu.Lock()
	f.failNext = "InvalidChangeBatch"
	f.mu.Unlock()
	_, err = p.AppendRecords(context.Background(), "example.com.", []libdns.Record{txt})
	if err == nil || !strings.Contains(err.Error(), "InvalidChangeBatch") || !strings.Contains(err.Error(), "example.com.") {
		t.Fatalf("rejected change: err = %v, want the API's code and the zone", err)
	}
	if strings.Contains(err.Error(), testSecret) {
		t.Fatal("error text carries the secret key")
	}
}

func TestScrubRemovesConfiguredSecrets(t *testing.T) {
	p := &Provider{SecretAccessKey: testSecret, SessionToken: "tok-123"}
	err := p.scrub(fmt.Errorf("signing with %s and tok-123 failed", testSecret))
	if strings.Contains(err.Error(), testSecret) || strings.Contains(err.Error(), "tok-123") {
		t.Fatalf("scrub left a secret: %v", err)
	}
}

func TestProvisionDefaultsAndPlaceholders(t *testing.T) {
	awsEnv(t, "http://127.0.0.1:1")
	t.Setenv("LCHAT_TEST_ZONE", "ZFROMENV")
	p := &Provider{HostedZoneID: "{env.LCHAT_TEST_ZONE}"}
	provision(t, p)
	if p.HostedZoneID != "ZFROMENV" || p.Region != "us-east-1" || p.MaxRetries != 5 || time.Duration(p.MaxWait) != time.Minute {
		t.Fatalf("after provision: zone %q region %q retries %d wait %v", p.HostedZoneID, p.Region, p.MaxRetries, time.Duration(p.MaxWait))
	}

	t.Setenv("AWS_REGION", "eu-west-1")
	p = &Provider{}
	provision(t, p)
	if p.Region != "" {
		t.Fatalf("region %q set although AWS_REGION is; the SDK chain should decide", p.Region)
	}

	p = &Provider{AccessKeyID: testKeyID}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := p.Provision(ctx); err == nil {
		t.Fatal("provision accepted an access key id without its secret")
	}

	p = &Provider{Profile: "no-such-profile"}
	if err := p.Provision(ctx); err == nil {
		t.Fatal("provision accepted a profile that does not exist")
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input   string
		want    Provider
		wantErr string
	}{
		{input: `route53`, want: Provider{}},
		{input: `route53 Z123`, want: Provider{HostedZoneID: "Z123"}},
		{input: "route53 {\n hosted_zone_id {env.ZONE}\n region eu-west-1\n profile dns\n max_retries 3\n wait_for_sync\n max_wait 30s\n}",
			want: Provider{HostedZoneID: "{env.ZONE}", Region: "eu-west-1", Profile: "dns", MaxRetries: 3, WaitForSync: true, MaxWait: caddy.Duration(30 * time.Second)}},
		{input: "route53 {\n access_key_id AK\n secret_access_key SK\n session_token ST\n}",
			want: Provider{AccessKeyID: "AK", SecretAccessKey: "SK", SessionToken: "ST"}},
		{input: `route53 Z1 Z2`, wantErr: "wrong argument count"},
		{input: "route53 {\n region\n}", wantErr: "wrong argument count"},
		{input: "route53 {\n max_retries lots\n}", wantErr: "invalid max_retries"},
		{input: "route53 {\n max_wait soon\n}", wantErr: "invalid max_wait"},
		{input: "route53 {\n zone x\n}", wantErr: "unrecognized subdirective zone"},
	} {
		var p Provider
		err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want %q", tc.input, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.input, err)
			continue
		}
		if p.HostedZoneID != tc.want.HostedZoneID || p.Region != tc.want.Region || p.Profile != tc.want.Profile ||
			p.AccessKeyID != tc.want.AccessKeyID || p.SecretAccessKey != tc.want.SecretAccessKey || p.SessionToken != tc.want.SessionToken ||
			p.MaxRetries != tc.want.MaxRetries || p.WaitForSync != tc.want.WaitForSync || p.MaxWait != tc.want.MaxWait {
			t.Errorf("%q: got %+v, want %+v", tc.input, p, tc.want)
		}
	}
}

func TestMain(m *testing.M) {
	// The SDK must never reach a real AWS endpoint from these tests.
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	os.Exit(m.Run())
}
