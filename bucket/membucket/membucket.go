// Package membucket is the in-memory bucket.Bucket every plain test uses, and a wrapper that
// counts a bucket's requests and fails them on demand. The store keeps its own clock: by
// default the time package's (so testing/synctest drives it), or any function a test sets,
// like an S3 endpoint whose clock is not the boxes'. Real-store tests use bucket/filebucket
// and versitygw through tests/harness instead.
package membucket

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
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// Bucket is an in-memory bucket.Bucket with S3's semantics for what lchat relies on:
// key rules, content-hash ETags, conditional writes, lexical listing in pages, and the
// store's own clock in LastModified and ListPage.Now. The zero value is not usable; call New.
type Bucket struct {
	// Clock is the store's clock. Default: time.Now.
	Clock func() time.Time
	// Offset shifts the store's clock, like a bucket whose clock disagrees with the
	// boxes'. Zero means none.
	Offset time.Duration
	// Granularity truncates LastModified and Now, as S3's whole-second timestamps do.
	// Zero keeps full precision.
	Granularity time.Duration
	// PageSize limits a List page. Default: 1000, as S3's.
	PageSize int

	mu   sync.Mutex
	objs map[string]object
}

type object struct {
	data []byte
	info bucket.Info
}

// New returns an empty Bucket.
func New() *Bucket { return &Bucket{objs: map[string]object{}} }

// Now is the store's clock, as it stamps LastModified and ListPage.Now.
func (b *Bucket) Now() time.Time {
	now := time.Now
	if b.Clock != nil {
		now = b.Clock
	}
	t := now().Add(b.Offset)
	if b.Granularity > 0 {
		t = t.Truncate(b.Granularity)
	}
	return t
}

// Get implements bucket.Bucket.
func (b *Bucket) Get(ctx context.Context, key string) (*bucket.Object, error) {
	if err := bucket.CheckKey(key); err != nil {
		return nil, err
	}
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
func (b *Bucket) Head(ctx context.Context, key string) (bucket.Info, error) {
	o, err := b.Get(ctx, key)
	if err != nil {
		return bucket.Info{}, err
	}
	return o.Info, nil
}

// Put implements bucket.Bucket. A body that is not size bytes long (when size is not -1)
// stores nothing, as on S3.
func (b *Bucket) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if err := bucket.CheckKey(key); err != nil {
		return bucket.Info{}, err
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return bucket.Info{}, fmt.Errorf("put %s: reading body: %w", key, err)
	}
	if size >= 0 && int64(len(data)) != size {
		return bucket.Info{}, fmt.Errorf("put %s: body is %d bytes, announced %d", key, len(data), size)
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
	info := bucket.Info{Key: key, Size: int64(len(data)), ETag: `"` + hex.EncodeToString(sum[:]) + `"`, LastModified: b.Now()}
	b.objs[key] = object{data: data, info: info}
	return info, nil
}

// Delete implements bucket.Bucket.
func (b *Bucket) Delete(ctx context.Context, key string, cond bucket.Cond) error {
	if err := bucket.CheckKey(key); err != nil {
		return err
	}
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
func (b *Bucket) List(ctx context.Context, prefix, token string) (bucket.ListPage, error) {
	if err := bucket.CheckPrefix(prefix); err != nil {
		return bucket.ListPage{}, err
	}
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
	page := bucket.ListPage{Now: b.Now()}
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
func (b *Bucket) Copy(ctx context.Context, src, dst string) (bucket.Info, error) {
	if err := bucket.CheckKey(dst); err != nil {
		return bucket.Info{}, err
	}
	o, err := b.Get(ctx, src)
	if err != nil {
		return bucket.Info{}, err
	}
	defer o.Body.Close()
	return b.Put(ctx, dst, o.Body, o.Size, bucket.Cond{})
}

// String implements bucket.Bucket.
func (b *Bucket) String() string { return "memory" }

// Interface guards
var _ bucket.Bucket = (*Bucket)(nil)
