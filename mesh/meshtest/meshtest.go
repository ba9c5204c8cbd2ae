// Package meshtest has test doubles for the mesh and ledger tests: an in-memory bucket
// whose clock is the time package's (so testing/synctest drives it), and a wrapper that
// counts and can fail a bucket's requests. Real-store tests use bucket/filebucket and
// versitygw through tests/harness instead.
package meshtest

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// MemBucket is an in-memory bucket.Bucket with S3's semantics for what the mesh relies on:
// content-hash ETags, conditional writes, lexical listing in pages, and the store's own
// clock in ListPage.Now.
type MemBucket struct {
	// Granularity truncates LastModified and Now, as S3's whole-second timestamps do.
	// Zero keeps full precision.
	Granularity time.Duration
	// Offset shifts the store's clock from the time package's, like a bucket whose
	// clock disagrees with the boxes'. Zero means none.
	Offset time.Duration
	// PageSize limits a List page. Default: 1000.
	PageSize int

	mu   sync.Mutex
	objs map[string]memObj
}

type memObj struct {
	data []byte
	info bucket.Info
}

// NewMemBucket returns an empty MemBucket.
func NewMemBucket() *MemBucket { return &MemBucket{objs: map[string]memObj{}} }

func (b *MemBucket) now() time.Time {
	t := time.Now().Add(b.Offset)
	if b.Granularity > 0 {
		t = t.Truncate(b.Granularity)
	}
	return t
}

// Get implements bucket.Bucket.
func (b *MemBucket) Get(ctx context.Context, key string) (*bucket.Object, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	o, ok := b.objs[key]
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, bucket.ErrNotFound)
	}
	return &bucket.Object{Info: o.info, Body: io.NopCloser(bytes.NewReader(o.data))}, nil
}

// Head implements bucket.Bucket.
func (b *MemBucket) Head(ctx context.Context, key string) (bucket.Info, error) {
	o, err := b.Get(ctx, key)
	if err != nil {
		return bucket.Info{}, err
	}
	return o.Info, nil
}

// Put implements bucket.Bucket.
func (b *MemBucket) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	data, err := io.ReadAll(body)
	if err != nil {
		return bucket.Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return bucket.Info{}, err
	}
	sum := md5.Sum(data)
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, exists := b.objs[key]
	if cond.IfNoneMatch && exists {
		return bucket.Info{}, fmt.Errorf("put %s: %w", key, bucket.ErrPreconditionFailed)
	}
	if cond.IfMatch != "" && (!exists || cur.info.ETag != cond.IfMatch) {
		return bucket.Info{}, fmt.Errorf("put %s: %w", key, bucket.ErrPreconditionFailed)
	}
	info := bucket.Info{Key: key, Size: int64(len(data)), ETag: `"` + hex.EncodeToString(sum[:]) + `"`, LastModified: b.now()}
	b.objs[key] = memObj{data: data, info: info}
	return info, nil
}

// Delete implements bucket.Bucket.
func (b *MemBucket) Delete(ctx context.Context, key string, cond bucket.Cond) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, exists := b.objs[key]
	if cond.IfMatch != "" && (!exists || cur.info.ETag != cond.IfMatch) {
		return fmt.Errorf("delete %s: %w", key, bucket.ErrPreconditionFailed)
	}
	delete(b.objs, key)
	return nil
}

// List implements bucket.Bucket.
func (b *MemBucket) List(ctx context.Context, prefix, token string) (bucket.ListPage, error) {
	if err := ctx.Err(); err != nil {
		return bucket.ListPage{}, err
	}
	n := b.PageSize
	if n <= 0 {
		n = 1000
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var keys []string
	for k := range b.objs {
		if strings.HasPrefix(k, prefix) && k > token {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	page := bucket.ListPage{Now: b.now()}
	for i, k := range keys {
		if i == n {
			page.NextToken = keys[i-1]
			break
		}
		page.Objects = append(page.Objects, b.objs[k].info)
	}
	return page, nil
}

// Copy implements bucket.Bucket.
func (b *MemBucket) Copy(ctx context.Context, src, dst string) (bucket.Info, error) {
	o, err := b.Get(ctx, src)
	if err != nil {
		return bucket.Info{}, err
	}
	defer o.Body.Close()
	return b.Put(ctx, dst, o.Body, o.Size, bucket.Cond{})
}

// String implements bucket.Bucket.
func (b *MemBucket) String() string { return "memory" }

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

// Counting wraps a bucket, counting requests by kind and failing them on demand.
type Counting struct {
	bucket.Bucket
	// fail, when set, is asked before each request; a non-nil error fails it unsent.
	fail atomic.Pointer[func(ctx context.Context, op Op, key string) error]

	mu     sync.Mutex
	counts map[Op]int64
}

// NewCounting wraps b.
func NewCounting(b bucket.Bucket) *Counting { return &Counting{Bucket: b, counts: map[Op]int64{}} }

// SetFail installs f, asked before each request: a non-nil error fails the request
// unsent. nil stops failing.
func (c *Counting) SetFail(f func(ctx context.Context, op Op, key string) error) {
	if f == nil {
		c.fail.Store(nil)
		return
	}
	c.fail.Store(&f)
}

func (c *Counting) note(ctx context.Context, op Op, key string) error {
	c.mu.Lock()
	c.counts[op]++
	c.mu.Unlock()
	if f := c.fail.Load(); f != nil {
		return (*f)(ctx, op, key)
	}
	return nil
}

// Counts returns a copy of the counts so far.
func (c *Counting) Counts() map[Op]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[Op]int64, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
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
	return c.Bucket.Get(ctx, key)
}

// Head implements bucket.Bucket.
func (c *Counting) Head(ctx context.Context, key string) (bucket.Info, error) {
	if err := c.note(ctx, OpHead, key); err != nil {
		return bucket.Info{}, err
	}
	return c.Bucket.Head(ctx, key)
}

// Put implements bucket.Bucket.
func (c *Counting) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if err := c.note(ctx, OpPut, key); err != nil {
		return bucket.Info{}, err
	}
	return c.Bucket.Put(ctx, key, body, size, cond)
}

// Delete implements bucket.Bucket.
func (c *Counting) Delete(ctx context.Context, key string, cond bucket.Cond) error {
	if err := c.note(ctx, OpDelete, key); err != nil {
		return err
	}
	return c.Bucket.Delete(ctx, key, cond)
}

// List implements bucket.Bucket.
func (c *Counting) List(ctx context.Context, prefix, token string) (bucket.ListPage, error) {
	if err := c.note(ctx, OpList, prefix); err != nil {
		return bucket.ListPage{}, err
	}
	return c.Bucket.List(ctx, prefix, token)
}

// Copy implements bucket.Bucket.
func (c *Counting) Copy(ctx context.Context, src, dst string) (bucket.Info, error) {
	if err := c.note(ctx, OpCopy, dst); err != nil {
		return bucket.Info{}, err
	}
	return c.Bucket.Copy(ctx, src, dst)
}

// Interface guards
var (
	_ bucket.Bucket = (*MemBucket)(nil)
	_ bucket.Bucket = (*Counting)(nil)
)
