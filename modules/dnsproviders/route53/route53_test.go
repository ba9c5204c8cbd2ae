package route53

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
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
	// rejectNext is a reason to reject the next change batch with, as an
	// InvalidChangeBatch document.
	rejectNext string
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
		// Sets in order from (name, type) on, at most maxitems of them, paginated
		// with NextRecordName/NextRecordType as Route53 does.
		q := r.URL.Query()
		keys := make([]string, 0, len(f.sets))
		for k := range f.sets {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		start := strings.TrimSpace(q.Get("name") + " " + q.Get("type"))
		limit := 100
		if n, err := strconv.Atoi(q.Get("maxitems")); err == nil && n > 0 {
			limit = n
		}
		fmt.Fprintf(w, `<?xml version="1.0"?><ListResourceRecordSetsResponse %s><ResourceRecordSets>`, ns)
		n, next := 0, ""
		for _, k := range keys {
			if k < start {
				continue
			}
			if n == limit {
				next = k
				break
			}
			n++
			vals := f.sets[k]
			name, typ, _ := strings.Cut(k, " ")
			fmt.Fprintf(w, `<ResourceRecordSet><Name>%s</Name><Type>%s</Type><TTL>%d</TTL><ResourceRecords>`, name, typ, f.ttls[k])
			for _, v := range vals {
				var esc strings.Builder
				_ = xml.EscapeText(&esc, []byte(v))
				fmt.Fprintf(w, `<ResourceRecord><Value>%s</Value></ResourceRecord>`, esc.String())
			}
			fmt.Fprint(w, `</ResourceRecords></ResourceRecordSet>`)
		}
		if next != "" {
			name, typ, _ := strings.Cut(next, " ")
			fmt.Fprintf(w, `</ResourceRecordSets><IsTruncated>true</IsTruncated><NextRecordName>%s</NextRecordName><NextRecordType>%s</NextRecordType><MaxItems>%d</MaxItems></ListResourceRecordSetsResponse>`, name, typ, limit)
		} else {
			fmt.Fprintf(w, `</ResourceRecordSets><IsTruncated>false</IsTruncated><MaxItems>%d</MaxItems></ListResourceRecordSetsResponse>`, limit)
		}
	case r.Method == http.MethodPost && strings.TrimSuffix(r.URL.Path, "/") == zonePath:
		var req changeBatchRequest
		if err := xml.Unmarshal(body, &req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `<ErrorResponse %s><Error><Type>Sender</Type><Code>MalformedInput</Code><Message>%v</Message></Error></ErrorResponse>`, ns, err)
			return
		}
		if f.rejectNext != "" {
			msg := f.rejectNext
			f.rejectNext = ""
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `<?xml version="1.0"?><InvalidChangeBatch %s><Messages><Message>%s</Message></Messages><RequestId>r4</RequestId></InvalidChangeBatch>`, ns, msg)
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
		// A batch applies whole or not at all; a DELETE must name the set exactly
		// as it is (values and TTL), as on Route53.
		sets, ttls := maps.Clone(f.sets), maps.Clone(f.ttls)
		reject := func(msg string) {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `<?xml version="1.0"?><InvalidChangeBatch %s><Messages><Message>%s</Message></Messages><RequestId>r3</RequestId></InvalidChangeBatch>`, ns, msg)
		}
		for _, c := range req.Changes {
			k := c.Set.Name + " " + c.Set.Type
			switch c.Action {
			case "CREATE":
				if _, ok := sets[k]; ok {
					reject(fmt.Sprintf("Tried to create resource record set [name='%s', type='%s'] but it already exists", c.Set.Name, c.Set.Type))
					return
				}
				sets[k], ttls[k] = c.Set.ResourceRecords, c.Set.TTL
			case "UPSERT":
				sets[k], ttls[k] = c.Set.ResourceRecords, c.Set.TTL
			case "DELETE":
				cur, ok := sets[k]
				if !ok {
					reject(fmt.Sprintf("Tried to delete resource record set [name='%s', type='%s'] but it was not found", c.Set.Name, c.Set.Type))
					return
				}
				if !slices.Equal(cur, c.Set.ResourceRecords) || ttls[k] != c.Set.TTL {
					reject(fmt.Sprintf("Tried to delete resource record set [name='%s', type='%s'] but the values provided do not match the current values", c.Set.Name, c.Set.Type))
					return
				}
				delete(sets, k)
				delete(ttls, k)
			}
		}
		f.sets, f.ttls = sets, ttls
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

// A call against an API that never answers ends at the provider's deadline with
// an error, instead of holding certmagic's issuance lock forever.
func TestHungAPICallEnds(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	awsEnv(t, srv.URL)
	p := &Provider{HostedZoneID: zoneID, MaxRetries: 1}
	provision(t, p)
	p.timeout = 100 * time.Millisecond
	done := make(chan error, 1)
	go func() {
		_, err := p.AppendRecords(context.Background(), "example.com.", []libdns.Record{libdns.TXT{Name: "_acme-challenge", Text: "v"}})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("append against a hung API succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("append against a hung API did not return")
	}
}

func TestMain(m *testing.M) {
	// The SDK must never reach a real AWS endpoint from these tests.
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	os.Exit(m.Run())
}

// A TXT value left on _acme-challenge (a box killed mid-challenge never cleaned
// up) must not block the next challenge: Route53 refuses the libdns provider's
// CREATE of an existing set, so the value joins the set in one atomic batch, and
// the challenge's delete removes only its own value.
func TestDNS01AppendBesideLeftoverValue(t *testing.T) {
	for _, tc := range []struct {
		name   string
		zoneID string
	}{
		{"zone looked up by name", ""},
		{"hosted zone id given", zoneID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := newFake(t)
			const k = "_acme-challenge.example.com. TXT"
			f.mu.Lock()
			f.sets[k] = []string{`"left-by-a-dead-box"`}
			f.ttls[k] = 120
			f.mu.Unlock()
			p := &Provider{HostedZoneID: tc.zoneID, MaxRetries: 1}
			provision(t, p)
			ctx := context.Background()
			txt := libdns.RR{Name: "_acme-challenge", Type: "TXT", Data: "token-value-1", TTL: 60 * time.Second}

			out, err := p.AppendRecords(ctx, "example.com.", []libdns.Record{txt})
			if err != nil {
				t.Fatalf("append beside a leftover value: %v", err)
			}
			if len(out) != 1 || out[0].RR().Data != "token-value-1" {
				t.Fatalf("append returned %v, want the one record appended", out)
			}
			f.mu.Lock()
			got, ttl := slices.Clone(f.sets[k]), f.ttls[k]
			f.mu.Unlock()
			slices.Sort(got)
			if !slices.Equal(got, []string{`"left-by-a-dead-box"`, `"token-value-1"`}) || ttl != 60 {
				t.Fatalf("TXT set = %q ttl %d, want the leftover and the new value, ttl 60", got, ttl)
			}
			// Appending the same value again changes nothing.
			if _, err := p.AppendRecords(ctx, "example.com.", []libdns.Record{txt}); err != nil {
				t.Fatalf("repeated append: %v", err)
			}
			f.mu.Lock()
			n := len(f.sets[k])
			f.mu.Unlock()
			if n != 2 {
				t.Fatalf("a repeated append left %d values, want 2", n)
			}

			if _, err := p.DeleteRecords(ctx, "example.com.", []libdns.Record{txt}); err != nil {
				t.Fatalf("delete: %v", err)
			}
			f.mu.Lock()
			got = f.sets[k]
			f.mu.Unlock()
			if !slices.Equal(got, []string{`"left-by-a-dead-box"`}) {
				t.Fatalf("after deleting the challenge value the set is %q, want only the leftover", got)
			}
		})
	}
}

// The value added to an existing set is written as the libdns provider writes
// TXT data (quoted, escaped, split at 255 bytes), so its later delete matches.
func TestRecordValue(t *testing.T) {
	long := strings.Repeat("a", 300)
	for _, tc := range []struct {
		rr   libdns.RR
		want string
	}{
		{libdns.RR{Type: "A", Data: "192.0.2.1"}, "192.0.2.1"},
		{libdns.RR{Type: "TXT", Data: "abc-_DEF"}, `"abc-_DEF"`},
		{libdns.RR{Type: "TXT", Data: `say "hi" \ ä`}, `"say \"hi\" \\ \303\244"`},
		{libdns.RR{Type: "TXT", Data: long}, `"` + long[:255] + `" "` + long[255:] + `"`},
	} {
		if got := recordValue(tc.rr); got != tc.want {
			t.Errorf("recordValue(%s %q) = %s, want %s", tc.rr.Type, tc.rr.Data, got, tc.want)
		}
	}
}

// A change Route53 rejects is reported with its reasons, not only the SDK's
// "ChangeBatch errors occurred"; a rejection other than "already exists" is not
// retried as an append to the existing set.
func TestRejectedBatchReasonIsReported(t *testing.T) {
	f, _ := newFake(t)
	p := &Provider{HostedZoneID: zoneID, MaxRetries: 1}
	provision(t, p)
	const reason = "RRSet with DNS name _z.example.com. is not permitted in zone example.com."
	f.mu.Lock()
	f.rejectNext = reason
	f.mu.Unlock()
	_, err := p.AppendRecords(context.Background(), "example.com.", []libdns.Record{libdns.TXT{Name: "_z", Text: "v", TTL: time.Minute}})
	if err == nil || !strings.Contains(err.Error(), reason) {
		t.Fatalf("rejected append: err = %v, want Route53's reason in it", err)
	}
	if reqs := f.take(); len(reqs) != 1 {
		t.Fatalf("requests after a rejected create: %v, want only the one change", reqs)
	}
}
