package bucket

import (
	"context"
	"io"
	"sync/atomic"
)

// Counted is a Bucket that counts the requests sent through it, for the metrics and the
// console's "bucket requests per minute". Every method forwards to the wrapped bucket.
type Counted struct {
	Bucket
	n atomic.Uint64
}

// NewCounted wraps b.
func NewCounted(b Bucket) *Counted { return &Counted{Bucket: b} }

// Requests returns how many requests went through c.
func (c *Counted) Requests() uint64 { return c.n.Load() }

// Get counts and forwards.
func (c *Counted) Get(ctx context.Context, key string) (*Object, error) {
	c.n.Add(1)
	return c.Bucket.Get(ctx, key)
}

// Head counts and forwards.
func (c *Counted) Head(ctx context.Context, key string) (Info, error) {
	c.n.Add(1)
	return c.Bucket.Head(ctx, key)
}

// Put counts and forwards.
func (c *Counted) Put(ctx context.Context, key string, body io.Reader, size int64, cond Cond) (Info, error) {
	c.n.Add(1)
	return c.Bucket.Put(ctx, key, body, size, cond)
}

// Delete counts and forwards.
func (c *Counted) Delete(ctx context.Context, key string, cond Cond) error {
	c.n.Add(1)
	return c.Bucket.Delete(ctx, key, cond)
}

// List counts and forwards.
func (c *Counted) List(ctx context.Context, prefix, token string) (ListPage, error) {
	c.n.Add(1)
	return c.Bucket.List(ctx, prefix, token)
}

// Copy counts and forwards.
func (c *Counted) Copy(ctx context.Context, src, dst string) (Info, error) {
	c.n.Add(1)
	return c.Bucket.Copy(ctx, src, dst)
}

// Unwrap returns the wrapped bucket.
func (c *Counted) Unwrap() Bucket { return c.Bucket }

// Interface guards
var _ Bucket = (*Counted)(nil)
