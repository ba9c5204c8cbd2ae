package certstorage

import (
	"bytes"
	"context"
	"crypto/md5"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// memBucket is an in-memory bucket.Bucket whose clock is time.Now, so inside a
// synctest bubble the lock protocol's timing runs on the bubble's fake clock.
// LastModified has S3's whole-second resolution and ETags are content MD5s, as on S3.
type memBucket struct {
	mu      sync.Mutex
	objs    map[string]memObj
	n       int
	stalled bool // every call fails, as with a cut network
	// lostReplies is how many of the next puts are applied but answered with an
	// error, as when a connection breaks after the store took the write.
	lostReplies int
	// hangs is how many of the next puts hang until their context ends.
	hangs int
}

type memObj struct {
	data []byte
	info bucket.Info
}

func newMemBucket() *memBucket { return &memBucket{objs: map[string]memObj{}} }

var errStalled = fmt.Errorf("bucket unreachable")

func (m *memBucket) setStalled(v bool) {
	m.mu.Lock()
	m.stalled = v
	m.mu.Unlock()
}

func (m *memBucket) Get(_ context.Context, key string) (*bucket.Object, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stalled {
		return nil, errStalled
	}
	if err := bucket.CheckKey(key); err != nil {
		return nil, err
	}
	o, ok := m.objs[key]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, bucket.ErrNotFound)
	}
	return &bucket.Object{Info: o.info, Body: io.NopCloser(bytes.NewReader(o.data))}, nil
}

func (m *memBucket) Head(_ context.Context, key string) (bucket.Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stalled {
		return bucket.Info{}, errStalled
	}
	if err := bucket.CheckKey(key); err != nil {
		return bucket.Info{}, err
	}
	o, ok := m.objs[key]
	if !ok {
		return bucket.Info{}, fmt.Errorf("head %s: %w", key, bucket.ErrNotFound)
	}
	return o.info, nil
}

func (m *memBucket) Put(ctx context.Context, key string, body io.Reader, _ int64, cond bucket.Cond) (bucket.Info, error) {
	if err := bucket.CheckKey(key); err != nil {
		return bucket.Info{}, err
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return bucket.Info{}, err
	}
	m.mu.Lock()
	if m.hangs > 0 {
		m.hangs--
		m.mu.Unlock()
		<-ctx.Done()
		return bucket.Info{}, ctx.Err()
	}
	defer m.mu.Unlock()
	if m.stalled {
		return bucket.Info{}, errStalled
	}
	o, exists := m.objs[key]
	if cond.IfNoneMatch && exists {
		return bucket.Info{}, fmt.Errorf("put %s: %w", key, bucket.ErrPreconditionFailed)
	}
	if cond.IfMatch != "" && (!exists || o.info.ETag != cond.IfMatch) {
		return bucket.Info{}, fmt.Errorf("put %s: %w", key, bucket.ErrPreconditionFailed)
	}
	m.n++
	info := bucket.Info{Key: key, Size: int64(len(data)), ETag: fmt.Sprintf(`"%x"`, md5.Sum(data)), LastModified: time.Now().Truncate(time.Second)}
	m.objs[key] = memObj{data: data, info: info}
	if m.lostReplies > 0 {
		m.lostReplies--
		return bucket.Info{}, fmt.Errorf("put %s: connection reset", key)
	}
	return info, nil
}

func (m *memBucket) set(f func(m *memBucket)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m)
}

func (m *memBucket) Delete(_ context.Context, key string, cond bucket.Cond) error {
	if err := bucket.CheckKey(key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stalled {
		return errStalled
	}
	o, exists := m.objs[key]
	if cond.IfMatch != "" && (!exists || o.info.ETag != cond.IfMatch) {
		return fmt.Errorf("delete %s: %w", key, bucket.ErrPreconditionFailed)
	}
	delete(m.objs, key)
	return nil
}

func (m *memBucket) List(_ context.Context, prefix, token string) (bucket.ListPage, error) {
	if err := bucket.CheckPrefix(prefix); err != nil {
		return bucket.ListPage{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stalled {
		return bucket.ListPage{}, errStalled
	}
	var keys []string
	for k := range m.objs {
		if strings.HasPrefix(k, prefix) && k > token {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	page := bucket.ListPage{Now: time.Now()}
	const pageSize = 1000
	for i, k := range keys {
		if i == pageSize {
			page.NextToken = keys[i-1]
			break
		}
		page.Objects = append(page.Objects, m.objs[k].info)
	}
	return page, nil
}

func (m *memBucket) Copy(ctx context.Context, src, dst string) (bucket.Info, error) {
	obj, err := m.Get(ctx, src)
	if err != nil {
		return bucket.Info{}, err
	}
	defer obj.Body.Close()
	return m.Put(ctx, dst, obj.Body, obj.Size, bucket.Cond{})
}

func (m *memBucket) String() string { return "mem://" }
