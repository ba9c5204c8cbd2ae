package mesh_test

import (
	"context"
	"testing"

	"github.com/lchat/lchat-caddy/bucket/s3bucket"
)

func newS3Bucket(t *testing.T, cfg s3bucket.Config) *s3bucket.Bucket {
	t.Helper()
	b, err := s3bucket.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
