package certstorage

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/lchat/lchat-caddy/certlock"
	_ "github.com/lchat/lchat-caddy/modules/buckets"
)

// The snippet the shipped Caddyfiles use for LCHAT_CERT_CACHE=s3 adapts to the
// storage module with the bucket guest module inline.
func TestAdaptCaddyfile(t *testing.T) {
	input := `{
	storage lchat {
		bucket s3 {env.LCHAT_HIBERNATE_BUCKET} {
			prefix {env.LCHAT_HIBERNATE_PREFIX}
		}
		lock_ttl 90s
	}
}
`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `"storage":{"bucket":{"backend":"s3","bucket":"{env.LCHAT_HIBERNATE_BUCKET}","prefix":"{env.LCHAT_HIBERNATE_PREFIX}"},"lock_ttl":90000000000,"module":"lchat"}`
	if !strings.Contains(string(out), want) {
		t.Fatalf("adapted JSON lacks %s:\n%s", want, out)
	}
}

// JSON config gets the same defaults and placeholder expansion as the Caddyfile:
// both happen in Provision. The storage it hands certmagic works on the bucket.
func TestProvisionDefaults(t *testing.T) {
	root := t.TempDir()
	t.Setenv("LCHAT_TEST_CERT_PREFIX", "tls")
	for _, tc := range []struct {
		json               string
		prefix             string
		ttl, refresh, poll time.Duration
	}{
		{`{"bucket":{"backend":"file","root":"` + root + `"}}`, "certs/", certlock.DefaultTTL, certlock.DefaultTTL / 4, certlock.DefaultPoll},
		{`{"bucket":{"backend":"file","root":"` + root + `"},"prefix":"{env.LCHAT_TEST_CERT_PREFIX}","lock_ttl":"40s","lock_poll":"250ms"}`, "tls/", 40 * time.Second, 10 * time.Second, 250 * time.Millisecond},
	} {
		var m Module
		if err := json.Unmarshal([]byte(tc.json), &m); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		if err := m.Provision(ctx); err != nil {
			cancel()
			t.Fatalf("%s: provision: %v", tc.json, err)
		}
		if err := m.Validate(); err != nil {
			t.Errorf("%s: validate: %v", tc.json, err)
		}
		st, _ := m.CertMagicStorage()
		s := st.(*Storage)
		if s.Prefix != tc.prefix || s.Locker.TTL != tc.ttl || s.Locker.Refresh != tc.refresh || s.Locker.Poll != tc.poll {
			t.Errorf("%s: prefix %q ttl %v refresh %v poll %v; want %q %v %v %v", tc.json,
				s.Prefix, s.Locker.TTL, s.Locker.Refresh, s.Locker.Poll, tc.prefix, tc.ttl, tc.refresh, tc.poll)
		}
		if err := st.Store(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(root, tc.prefix, "k")); err != nil {
			t.Errorf("%s: the value is not under %s in the bucket: %v", tc.json, tc.prefix, err)
		}
		if err := m.Cleanup(); err != nil {
			t.Error(err)
		}
		cancel()
	}

	// A missing bucket fails Provision, and Cleanup still works after that.
	var m Module
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := m.Provision(ctx); err == nil {
		t.Fatal("provision without a bucket succeeded")
	}
	if err := m.Cleanup(); err != nil {
		t.Fatal(err)
	}
}
