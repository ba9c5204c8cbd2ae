package main

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/s3bucket"
)

// testS3 is lchat.buckets.lchat_test_s3, a stand-in for the lchat.buckets.s3 module
// (modules/buckets, not written yet when these tests were): an s3bucket built from
// the same fields. Credentials come from the environment through placeholders.
type testS3 struct {
	BucketName      string `json:"bucket,omitempty"`
	Prefix          string `json:"prefix,omitempty"`
	Region          string `json:"region,omitempty"`
	Endpoint        string `json:"endpoint,omitempty"`
	AccessKeyID     string `json:"access_key_id,omitempty"`
	SecretAccessKey string `json:"secret_access_key,omitempty"`

	b *s3bucket.Bucket
}

func init() { caddy.RegisterModule(testS3{}) }

func (testS3) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "lchat.buckets.lchat_test_s3", New: func() caddy.Module { return new(testS3) }}
}

func (m *testS3) Provision(ctx caddy.Context) error {
	r := caddy.NewReplacer()
	b, err := s3bucket.New(ctx, s3bucket.Config{
		Bucket: r.ReplaceAll(m.BucketName, ""), Prefix: r.ReplaceAll(m.Prefix, ""), Region: r.ReplaceAll(m.Region, ""),
		Endpoint: r.ReplaceAll(m.Endpoint, ""), UsePathStyle: true,
		AccessKeyID: r.ReplaceAll(m.AccessKeyID, ""), SecretAccessKey: r.ReplaceAll(m.SecretAccessKey, ""),
	})
	if err != nil {
		return fmt.Errorf("loading bucket: %v", err)
	}
	m.b = b
	return nil
}

// Bucket returns the provisioned bucket.
func (m *testS3) Bucket() bucket.Bucket { return m.b }
