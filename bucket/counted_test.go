package bucket_test

import (
	"context"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

func TestCountedCountsEveryRequest(t *testing.T) {
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := bucket.NewCounted(fb)
	ctx := context.Background()
	if _, err := c.Put(ctx, "a", strings.NewReader("x"), 1, bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	c.Head(ctx, "a")
	if obj, err := c.Get(ctx, "a"); err == nil {
		obj.Body.Close()
	}
	c.List(ctx, "", "")
	c.Copy(ctx, "a", "b")
	c.Delete(ctx, "b", bucket.Cond{})
	if got := c.Requests(); got != 6 {
		t.Fatalf("Requests = %d, want 6", got)
	}
	if c.String() != fb.String() {
		t.Fatalf("String %q, want the wrapped bucket's %q", c.String(), fb.String())
	}
}
