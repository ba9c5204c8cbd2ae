package membucket

import (
	"context"
	"io"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/lchat/lchat-caddy/bucket"
)

// Op names a bucket request kind.
type Op string

// The bucket request kinds.
const (
	OpGet    Op = "GET"
	OpHead   Op = "HEAD"
	OpPut    Op = "PUT"
	OpDelete Op = "DELETE"
	OpList   Op = "LIST"
	OpCopy   Op = "COPY"
)

// Counting wraps a bucket, counting requests by kind and failing them on demand: before
// they are sent (a cut network, a hung request) or after the store applied them (a reply
// lost on the way back).
type Counting struct {
	bucket.Bucket
	// before, when set, is asked before each request; a non-nil error fails it unsent.
	before atomic.Pointer[func(ctx context.Context, op Op, key string) error]
	// after, when set, is asked after each request with its result; what it returns is
	// the request's error.
	after atomic.Pointer[func(ctx context.Context, op Op, key string, err error) error]

	mu     sync.Mutex
	counts map[Op]int64
}

// NewCounting wraps b.
func NewCounting(b bucket.Bucket) *Counting { return &Counting{Bucket: b, counts: map[Op]int64{}} }

// SetFail installs f, asked before each request: a non-nil error fails the request
// unsent. f may block (until ctx ends, say) to model a hung request. nil stops failing.
func (c *Counting) SetFail(f func(ctx context.Context, op Op, key string) error) {
	if f == nil {
		c.before.Store(nil)
		return
	}
	c.before.Store(&f)
}

// SetAfter installs f, asked after each request with the store's answer: the error it
// returns replaces the answer's, so a write the store applied can still fail as a lost
// reply does. nil stops it.
func (c *Counting) SetAfter(f func(ctx context.Context, op Op, key string, err error) error) {
	if f == nil {
		c.after.Store(nil)
		return
	}
	c.after.Store(&f)
}

func (c *Counting) note(ctx context.Context, op Op, key string) error {
	c.mu.Lock()
	c.counts[op]++
	c.mu.Unlock()
	if f := c.before.Load(); f != nil {
		return (*f)(ctx, op, key)
	}
	return nil
}

func (c *Counting) done(ctx context.Context, op Op, key string, err error) error {
	if f := c.after.Load(); f != nil {
		return (*f)(ctx, op, key, err)
	}
	return err
}

// Counts returns a copy of the counts so far.
func (c *Counting) Counts() map[Op]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

// Total is the number of requests so far.
func (c *Counting) Total() int64 {
	var n int64
	for _, v := range c.Counts() {
		n += v
	}
	return n
}

// Reset zeroes the counts.
func (c *Counting) Reset() {
	c.mu.Lock()
	c.counts = map[Op]int64{}
	c.mu.Unlock()
}

// Get implements bucket.Bucket.
func (c *Counting) Get(ctx context.Context, key string) (*bucket.Object, error) {
	if err := c.note(ctx, OpGet, key); err != nil {
		return nil, err
	}
	o, err := c.Bucket.Get(ctx, key)
	if err = c.done(ctx, OpGet, key, err); err != nil {
		if o != nil {
			o.Body.Close()
		}
		return nil, err
	}
	return o, nil
}

// Head implements bucket.Bucket.
func (c *Counting) Head(ctx context.Context, key string) (bucket.Info, error) {
	if err := c.note(ctx, OpHead, key); err != nil {
		return bucket.Info{}, err
	}
	info, err := c.Bucket.Head(ctx, key)
	if err = c.done(ctx, OpHead, key, err); err != nil {
		return bucket.Info{}, err
	}
	return info, nil
}

// Put implements bucket.Bucket.
func (c *Counting) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if err := c.note(ctx, OpPut, key); err != nil {
		return bucket.Info{}, err
	}
	info, err := c.Bucket.Put(ctx, key, body, size, cond)
	if err = c.done(ctx, OpPut, key, err); err != nil {
		return bucket.Info{}, err
	}
	return info, nil
}

// Delete implements bucket.Bucket.
func (c *Counting) Delete(ctx context.Context, key string, cond bucket.Cond) error {
	if err := c.note(ctx, OpDelete, key); err != nil {
		return err
	}
	return c.done(ctx, OpDelete, key, c.Bucket.Delete(ctx, key, cond))
}

// List implements bucket.Bucket.
func (c *Counting) List(ctx context.Context, prefix, token string) (bucket.ListPage, error) {
	if err := c.note(ctx, OpList, prefix); err != nil {
		return bucket.ListPage{}, err
	}
	page, err := c.Bucket.List(ctx, prefix, token)
	if err = c.done(ctx, OpList, prefix, err); err != nil {
		return bucket.ListPage{}, err
	}
	return page, nil
}

// Copy implements bucket.Bucket.
func (c *Counting) Copy(ctx context.Context, src, dst string) (bucket.Info, error) {
	if err := c.note(ctx, OpCopy, dst); err != nil {
		return bucket.Info{}, err
	}
	info, err := c.Bucket.Copy(ctx, src, dst)
	if err = c.done(ctx, OpCopy, dst, err); err != nil {
		return bucket.Info{}, err
	}
	return info, nil
}

// Interface guards
var _ bucket.Bucket = (*Counting)(nil)
