package s3bucket_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/buckettest"
	"github.com/lchat/lchat-caddy/bucket/s3bucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

func TestConformance(t *testing.T) {
	s3 := harness.StartS3(t)
	var n atomic.Int64
	// One server, a fresh prefix per subtest: also proves prefixes isolate.
	buckettest.Run(t, func(t *testing.T) bucket.Bucket {
		return s3.NewBucket(t, fmt.Sprintf("conformance/%d", n.Add(1)))
	})
}

func TestConformanceNoPrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("one server per subtest")
	}
	buckettest.Run(t, func(t *testing.T) bucket.Bucket {
		return harness.StartS3(t).NewBucket(t, "")
	})
}

func TestConfigErrors(t *testing.T) {
	const secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
	cases := []struct {
		name string
		cfg  s3bucket.Config
		want string
	}{
		{"no bucket", s3bucket.Config{}, "bucket is required"},
		{"blank bucket", s3bucket.Config{Bucket: "  "}, "bucket is required"},
		{"endpoint without scheme", s3bucket.Config{Bucket: "b", Endpoint: "127.0.0.1:9000"}, "endpoint must be http(s)://host[:port]"},
		{"endpoint ftp", s3bucket.Config{Bucket: "b", Endpoint: "ftp://h"}, "endpoint must be"},
		{"endpoint with path", s3bucket.Config{Bucket: "b", Endpoint: "https://h/x"}, "endpoint must be"},
		{"endpoint no host", s3bucket.Config{Bucket: "b", Endpoint: "https://"}, "endpoint must be"},
		{"endpoint with credentials", s3bucket.Config{Bucket: "b", Endpoint: "https://AKIA:" + secret + "@h"}, "endpoint must be"},
		{"endpoint garbage", s3bucket.Config{Bucket: "b", Endpoint: "http://[::1" + secret}, "endpoint must be"},
		{"half credentials", s3bucket.Config{Bucket: "b", SecretAccessKey: secret}, "access_key_id and secret_access_key"},
		{"token alone", s3bucket.Config{Bucket: "b", SessionToken: secret}, "session_token"},
		{"bad prefix", s3bucket.Config{Bucket: "b", Prefix: "a/../b"}, "prefix"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s3bucket.New(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error leaks the secret: %v", err)
			}
		})
	}
	// The endpoint the SDK would take from the environment is checked as strictly,
	// naming the variable.
	for _, name := range []string{"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("AWS_ENDPOINT_URL_S3", "")
			t.Setenv("AWS_ENDPOINT_URL", "")
			t.Setenv(name, "https://AKIA:"+secret+"@s3.example.com/path")
			_, err := s3bucket.New(context.Background(), s3bucket.Config{Bucket: "b"})
			if err == nil || !strings.Contains(err.Error(), name+": endpoint must be") {
				t.Fatalf("New with a malformed %s = %v", name, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error leaks the secret: %v", err)
			}
			// An explicit endpoint overrides the environment, so it is not checked.
			if _, err := s3bucket.New(context.Background(), s3bucket.Config{Bucket: "b", Endpoint: "http://127.0.0.1:9000"}); err != nil {
				t.Fatalf("explicit endpoint with a malformed %s: %v", name, err)
			}
		})
	}
	for _, ok := range []string{"http://127.0.0.1:9000", "https://s3.example.com", "https://s3.example.com/"} {
		if _, err := s3bucket.New(context.Background(), s3bucket.Config{Bucket: "b", Endpoint: ok}); err != nil {
			t.Errorf("endpoint %s: %v", ok, err)
		}
	}
}

func TestSecretsNotShown(t *testing.T) {
	s3 := harness.StartS3(t)
	b := s3.NewBucket(t, "p")
	if strings.Contains(b.String(), s3.SecretKey) || strings.Contains(b.String(), s3.AccessKey) {
		t.Fatalf("String() shows credentials: %s", b)
	}
	// A wrong secret makes the store refuse; the error must not echo either key.
	cfg := s3.Config("p")
	cfg.SecretAccessKey = "not-the-secret-" + s3.SecretKey[:8]
	bad, err := s3bucket.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.Put(context.Background(), "k", strings.NewReader("x"), 1, bucket.Cond{})
	if err == nil {
		t.Fatal("put with a wrong secret succeeded")
	}
	if strings.Contains(err.Error(), cfg.SecretAccessKey) || strings.Contains(err.Error(), s3.SecretKey) {
		t.Fatalf("error leaks a secret: %v", err)
	}
	if errors.Is(err, bucket.ErrNotFound) || errors.Is(err, bucket.ErrPreconditionFailed) {
		t.Fatalf("auth failure mapped to a typed bucket error: %v", err)
	}
}

func TestMissingBucket(t *testing.T) {
	s3 := harness.StartS3(t)
	cfg := s3.Config("")
	cfg.Bucket = "no-such-bucket"
	b, err := s3bucket.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A missing bucket must not look like a missing key: that would read as "free lease".
	if _, err := b.Get(context.Background(), "k"); err == nil || errors.Is(err, bucket.ErrNotFound) {
		t.Fatalf("Get in a missing bucket = %v, want an error that is not ErrNotFound", err)
	}
	if _, err := b.List(context.Background(), "", ""); err == nil {
		t.Fatal("List in a missing bucket succeeded")
	}
}
