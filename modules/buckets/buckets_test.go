package buckets

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/check"
	"github.com/lchat/lchat-caddy/tests/harness"
)

const secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"

func newCtx(t *testing.T) caddy.Context {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx
}

func TestS3ProvisionErrors(t *testing.T) {
	t.Setenv("LCHAT_TEST_SECRET", secret)
	cases := []struct {
		name string
		mod  S3
		want string
	}{
		{"no bucket", S3{SecretAccessKey: secret, AccessKeyID: "AKIA"}, "lchat.buckets.s3: bucket is required"},
		{"bucket from an unset env", S3{Bucket: "{env.LCHAT_TEST_UNSET_BUCKET}"}, "lchat.buckets.s3: bucket is required"},
		{"malformed endpoint", S3{Bucket: "b", Endpoint: "s3.example.com:9000", AccessKeyID: "AKIA", SecretAccessKey: "{env.LCHAT_TEST_SECRET}"}, "lchat.buckets.s3: endpoint must be http(s)://host[:port]"},
		{"endpoint with a path", S3{Bucket: "b", Endpoint: "https://s3.example.com/bucket"}, "lchat.buckets.s3: endpoint must be"},
		{"endpoint with credentials", S3{Bucket: "b", Endpoint: "https://AKIA:" + secret + "@s3.example.com"}, "lchat.buckets.s3: endpoint must be"},
		{"secret without id", S3{Bucket: "b", SecretAccessKey: "{env.LCHAT_TEST_SECRET}"}, "lchat.buckets.s3: access_key_id and secret_access_key must be set together"},
		{"bad prefix", S3{Bucket: "b", Prefix: "a/../b"}, "lchat.buckets.s3: prefix"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.mod
			err := m.Provision(newCtx(t))
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("Provision = %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error shows the secret: %v", err)
			}
		})
	}
}

func TestS3ProvisionPlaceholders(t *testing.T) {
	t.Setenv("LCHAT_TEST_BUCKET", "state")
	t.Setenv("LCHAT_TEST_ENDPOINT", "http://127.0.0.1:9000")
	t.Setenv("LCHAT_TEST_SECRET", secret)
	m := S3{Bucket: "{env.LCHAT_TEST_BUCKET}", Prefix: "p/{env.LCHAT_TEST_BUCKET}", Endpoint: "{env.LCHAT_TEST_ENDPOINT}",
		UsePathStyle: true, AccessKeyID: "AKIA", SecretAccessKey: "{env.LCHAT_TEST_SECRET}"}
	if err := m.Provision(newCtx(t)); err != nil {
		t.Fatal(err)
	}
	if m.Bucket != "state" || m.Prefix != "p/state" || m.SecretAccessKey != secret {
		t.Fatalf("placeholders not expanded: %+v", m)
	}
	if got := m.String(); got != "s3://state/p/state at http://127.0.0.1:9000" || strings.Contains(got, secret) {
		t.Fatalf("String() = %q", got)
	}
}

func TestFileProvision(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("LCHAT_TEST_ROOT", dir)
	m := File{Root: "{env.LCHAT_TEST_ROOT}/bucket", Prefix: "prod"}
	if err := m.Provision(newCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Put(context.Background(), "k", strings.NewReader("v"), 1, bucket.Cond{IfNoneMatch: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "bucket", "prod", "k")); err != nil {
		t.Fatalf("object not under root/prefix: %v", err)
	}

	// An unwritable root stops start-up naming the field and the path.
	file := filepath.Join(dir, "a-file")
	os.WriteFile(file, nil, 0o644)
	bad := File{Root: filepath.Join(file, "bucket")}
	err := bad.Provision(newCtx(t))
	if err == nil || !strings.HasPrefix(err.Error(), "lchat.buckets.file: root:") || !strings.Contains(err.Error(), file) {
		t.Fatalf("Provision with an unusable root = %v", err)
	}
	badPrefix := File{Root: dir, Prefix: "../x"}
	if err := badPrefix.Provision(newCtx(t)); err == nil || !strings.Contains(err.Error(), "lchat.buckets.file: prefix") {
		t.Fatalf("Provision with a bad prefix = %v", err)
	}
}

func TestFileDefaultRoot(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	m := File{}
	if err := m.Provision(newCtx(t)); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(caddy.AppDataDir(), "lchat", "bucket"); m.Root != want {
		t.Fatalf("default root %q, want %q", m.Root, want)
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	good := []struct {
		input string
		got   caddyfile.Unmarshaler
		want  any
	}{
		{`s3 {
			bucket {env.LCHAT_HIBERNATE_BUCKET}
			prefix prod
			region eu-west-1
			endpoint http://127.0.0.1:7070
			use_path_style
			access_key_id {env.AWS_ACCESS_KEY_ID}
			secret_access_key {env.AWS_SECRET_ACCESS_KEY}
			session_token tok
		}`, &S3{}, &S3{Bucket: "{env.LCHAT_HIBERNATE_BUCKET}", Prefix: "prod", Region: "eu-west-1", Endpoint: "http://127.0.0.1:7070",
			UsePathStyle: true, AccessKeyID: "{env.AWS_ACCESS_KEY_ID}", SecretAccessKey: "{env.AWS_SECRET_ACCESS_KEY}", SessionToken: "tok"}},
		{`s3 my-bucket`, &S3{}, &S3{Bucket: "my-bucket"}},
		{"file /var/lib/lchat/bucket {\n prefix p\n}", &File{}, &File{Root: "/var/lib/lchat/bucket", Prefix: "p"}},
		{`file {
			root /data
		}`, &File{}, &File{Root: "/data"}},
		{`file`, &File{}, &File{}},
	}
	for _, tc := range good {
		if err := tc.got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
			t.Errorf("%s: %v", tc.input, err)
			continue
		}
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.input, tc.got, tc.want)
		}
	}
	bad := []struct {
		input string
		mod   caddyfile.Unmarshaler
		want  string
	}{
		{"s3 {\n bucket\n}", &S3{}, "wrong argument count"},
		{"s3 {\n bucket a b\n}", &S3{}, "wrong argument count"},
		{`s3 a b`, &S3{}, "wrong argument count"},
		{"s3 {\n use_path_style yes\n}", &S3{}, "wrong argument count"},
		{"s3 {\n bukket x\n}", &S3{}, "unrecognized subdirective bukket"},
		{`file /a /b`, &File{}, "wrong argument count"},
		{"file {\n prefix\n}", &File{}, "wrong argument count"},
		{"file {\n mode 0700\n}", &File{}, "unrecognized subdirective mode"},
	}
	for _, tc := range bad {
		err := tc.mod.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.input, err, tc.want)
		}
	}
}

func TestJSONFieldNames(t *testing.T) {
	raw := `{"bucket":"b","prefix":"p","region":"r","endpoint":"http://h:1","use_path_style":true,"access_key_id":"i","secret_access_key":"s","session_token":"t"}`
	var m S3
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(S3{Bucket: "b"})
	if string(out) != `{"bucket":"b"}` {
		t.Fatalf("omitempty: %s", out)
	}
}

func TestBucketFromFlags(t *testing.T) {
	ctx := newCtx(t)
	env := map[string]string{
		"LCHAT_HIBERNATE_BUCKET": "from-env", "LCHAT_HIBERNATE_PREFIX": "envprefix",
		"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:7070", "AWS_REGION": "eu-central-1",
	}
	b, err := bucketFromFlags(ctx, checkFlags{}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	s, ok := b.(*S3)
	if !ok || s.Bucket != "from-env" || s.Prefix != "envprefix" || s.Region != "eu-central-1" || !s.UsePathStyle {
		t.Fatalf("env defaults: %#v", b)
	}
	b, err = bucketFromFlags(ctx, checkFlags{Bucket: "flag", Endpoint: "https://s3.example.com", VirtualHost: true}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if s := b.(*S3); s.Bucket != "flag" || s.Endpoint != "https://s3.example.com" || s.UsePathStyle {
		t.Fatalf("flags over env: %#v", s)
	}
	dir := t.TempDir()
	b, err = bucketFromFlags(ctx, checkFlags{Bucket: "file://" + dir}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := b.(*File); !ok || f.Root != dir {
		t.Fatalf("file URL: %#v", b)
	}
	if _, err := bucketFromFlags(ctx, checkFlags{}, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "LCHAT_HIBERNATE_BUCKET") {
		t.Fatalf("no bucket anywhere: %v", err)
	}
	if _, err := bucketFromFlags(ctx, checkFlags{Bucket: "lchat-b", Endpoint: "nonsense"}, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "endpoint") {
		t.Fatalf("bad endpoint: %v", err)
	}
}

func TestBucketFromConfig(t *testing.T) {
	ctx := newCtx(t)
	dir := t.TempDir()
	cfg := `{"apps":{"http":{"servers":{}},"lchat":{"state_dir":"/x","bucket":{"backend":"file","root":"` + dir + `","prefix":"p"}}}}`
	b, err := bucketFromConfig(ctx, []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := b.(*File); !ok || f.Root != dir || f.Prefix != "p" {
		t.Fatalf("loaded %#v", b)
	}
	for cfg, want := range map[string]string{
		`{"apps":{}}`: "no apps.lchat.bucket",
		`{"apps":{"lchat":{"bucket":{"backend":"s3","secret_access_key":"` + secret + `"}}}}`: "bucket is required",
		`{"apps":{"lchat":{"bucket":{"backend":"nope"}}}}`:                                    "lchat.buckets.nope",
	} {
		_, err := bucketFromConfig(ctx, []byte(cfg))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", cfg, err, want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("error shows the secret: %v", err)
		}
	}
}

// ignoresConditions stands for an S3-compatible store that accepts conditional
// headers and ignores them.
type ignoresConditions struct{ bucket.Bucket }

func (b ignoresConditions) Put(ctx context.Context, key string, body io.Reader, size int64, _ bucket.Cond) (bucket.Info, error) {
	return b.Bucket.Put(ctx, key, body, size, bucket.Cond{})
}

func TestRunCheck(t *testing.T) {
	s3 := harness.StartS3(t)
	ctx := newCtx(t)
	t.Setenv("AWS_ACCESS_KEY_ID", s3.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3.SecretKey)
	// Credentials come from the standard chain, as for an operator.
	s3b, err := bucketFromFlags(ctx, checkFlags{Bucket: s3.Bucket, Endpoint: s3.Endpoint, Prefix: "lchat"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	fileb, err := bucketFromFlags(ctx, checkFlags{Bucket: "file://" + t.TempDir()}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    bucket.Bucket
		ok   bool
	}{
		{"versitygw", s3b, true},
		{"file", fileb, true},
		{"s3 ignoring conditions", ignoresConditions{s3b}, false},
		{"file ignoring conditions", ignoresConditions{fileb}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			rep, err := runCheck(ctx, tc.b, &out, check.Options{Racers: 16, Rounds: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + out.String())
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			verdict := lines[len(lines)-1]
			if rep.OK() != tc.ok || strings.HasPrefix(verdict, "OK") != tc.ok {
				t.Fatalf("verdict %q, want ok=%v", verdict, tc.ok)
			}
			if races := strings.Count(out.String(), "racers:"); races != 8 {
				t.Fatalf("%d race lines printed, want 8 (2 rounds of create, swap, missing, stale delete)", races)
			}
			if strings.Contains(out.String(), s3.SecretKey) {
				t.Fatal("output shows the secret")
			}
		})
	}
}

// TestS3FileURL: LCHAT_HIBERNATE_BUCKET=file:///path makes the shipped Caddyfiles (which
// say `bucket s3 {env.LCHAT_HIBERNATE_BUCKET}`) use the local store.
func TestS3FileURL(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("LCHAT_TEST_BUCKET", "file://"+dir)
	m := S3{Bucket: "{env.LCHAT_TEST_BUCKET}", Prefix: "prod"}
	if err := m.Provision(newCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Put(context.Background(), "k", strings.NewReader("v"), 1, bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "prod", "k")); err != nil {
		t.Fatalf("object not in the local directory under the prefix: %v", err)
	}
	for _, bad := range []string{"file://relative/dir", "file:", "file://otherhost/x"} {
		m := S3{Bucket: bad}
		if err := m.Provision(newCtx(t)); err == nil || !strings.Contains(err.Error(), "file:///absolute/path") {
			t.Errorf("Provision(%q) = %v, want a file:///absolute/path error", bad, err)
		}
	}
}

// TestS3ProvisionEnvEndpoint: the shipped Caddyfiles leave the endpoint to
// AWS_ENDPOINT_URL_S3; a malformed one stops start-up naming the variable.
func TestS3ProvisionEnvEndpoint(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_S3", "minio.internal:9000")
	m := S3{Bucket: "b"}
	err := m.Provision(newCtx(t))
	if err == nil || !strings.HasPrefix(err.Error(), "lchat.buckets.s3: ") || !strings.Contains(err.Error(), "AWS_ENDPOINT_URL_S3: endpoint must be http(s)://host[:port]") {
		t.Fatalf("Provision with a malformed AWS_ENDPOINT_URL_S3 = %v", err)
	}
}

// TestS3PathStyleDefault: with an endpoint (configured or from the environment) the
// server uses path style unless told otherwise, the same choice bucket-check makes.
func TestS3PathStyleDefault(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	t.Setenv("AWS_ENDPOINT_URL", "")
	cases := []struct {
		name string
		m    S3
		env  string
		want bool
	}{
		{"aws", S3{Bucket: "b", Region: "eu-west-1"}, "", false},
		{"endpoint field", S3{Bucket: "b", Region: "r", Endpoint: "http://127.0.0.1:9000"}, "", true},
		{"endpoint env", S3{Bucket: "b", Region: "r"}, "http://127.0.0.1:9000", true},
		{"virtual host kept", S3{Bucket: "b", Region: "r", Endpoint: "http://s3.local:9000", VirtualHost: true}, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("AWS_ENDPOINT_URL_S3", c.env)
			m := c.m
			if err := m.Provision(newCtx(t)); err != nil {
				t.Fatal(err)
			}
			if m.UsePathStyle != c.want {
				t.Errorf("UsePathStyle = %v, want %v", m.UsePathStyle, c.want)
			}
		})
	}
	both := S3{Bucket: "b", UsePathStyle: true, VirtualHost: true}
	if err := both.Provision(newCtx(t)); err == nil {
		t.Error("use_path_style with virtual_host was accepted")
	}
}
