package certstorage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/caddyserver/certmagic"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/certlock"
)

// Storage is a certmagic.Storage on a bucket: every key lives under Prefix
// ("certs/" in the module), and locks are a certlock.Locker under Prefix+"locks/".
type Storage struct {
	Bucket bucket.Bucket
	// Prefix ends in "/" or is empty.
	Prefix string
	*certlock.Locker
}

// NewStorage returns a Storage with keys under prefix and locker's locks, whose bucket
// and prefix it sets.
func NewStorage(b bucket.Bucket, prefix string, locker *certlock.Locker) *Storage {
	prefix = strings.Trim(prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	locker.Bucket = b
	locker.Prefix = prefix + "locks/"
	return &Storage{Bucket: b, Prefix: prefix, Locker: locker}
}

func (s *Storage) key(k string) string { return s.Prefix + strings.Trim(k, "/") }

// notExist maps the bucket's not-found to what certmagic tests for.
func notExist(err error) error {
	if errors.Is(err, bucket.ErrNotFound) {
		return fmt.Errorf("%w: %v", fs.ErrNotExist, err)
	}
	return err
}

// Store writes value at key, replacing it.
func (s *Storage) Store(ctx context.Context, key string, value []byte) error {
	if _, err := s.Bucket.Put(ctx, s.key(key), bytes.NewReader(value), int64(len(value)), bucket.Cond{}); err != nil {
		return fmt.Errorf("storing %s: %w", key, err)
	}
	return nil
}

// Load reads key; a missing key is fs.ErrNotExist.
func (s *Storage) Load(ctx context.Context, key string) ([]byte, error) {
	obj, err := s.Bucket.Get(ctx, s.key(key))
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", key, notExist(err))
	}
	defer obj.Body.Close()
	b, err := io.ReadAll(obj.Body)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", key, err)
	}
	return b, nil
}

// Delete removes key, and every key under it when it is a directory. A missing
// key is not an error.
func (s *Storage) Delete(ctx context.Context, key string) error {
	if err := s.Bucket.Delete(ctx, s.key(key), bucket.Cond{}); err != nil && !errors.Is(err, bucket.ErrNotFound) {
		return fmt.Errorf("deleting %s: %w", key, err)
	}
	keys, err := s.list(ctx, s.key(key)+"/")
	if err != nil {
		return fmt.Errorf("deleting %s: %w", key, err)
	}
	for _, k := range keys {
		if err := s.Bucket.Delete(ctx, k, bucket.Cond{}); err != nil && !errors.Is(err, bucket.ErrNotFound) {
			return fmt.Errorf("deleting %s: %w", k, err)
		}
	}
	return nil
}

// Exists reports whether key is a stored value or a directory of them.
func (s *Storage) Exists(ctx context.Context, key string) bool {
	_, err := s.Stat(ctx, key)
	return err == nil
}

// Stat describes key: a value, or a directory (IsTerminal false).
func (s *Storage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	info, err := s.Bucket.Head(ctx, s.key(key))
	if err == nil {
		return certmagic.KeyInfo{Key: key, Modified: info.LastModified, Size: info.Size, IsTerminal: true}, nil
	}
	if !errors.Is(err, bucket.ErrNotFound) {
		return certmagic.KeyInfo{}, fmt.Errorf("stat %s: %w", key, err)
	}
	page, err := s.Bucket.List(ctx, s.key(key)+"/", "")
	if err != nil {
		return certmagic.KeyInfo{}, fmt.Errorf("stat %s: %w", key, err)
	}
	if len(page.Objects) == 0 {
		return certmagic.KeyInfo{}, fmt.Errorf("stat %s: %w", key, fs.ErrNotExist)
	}
	return certmagic.KeyInfo{Key: key, IsTerminal: false}, nil
}

// List returns the keys under dir: every value below it when recursive, else its
// direct children (values and directories). A missing dir is fs.ErrNotExist.
func (s *Storage) List(ctx context.Context, dir string, recursive bool) ([]string, error) {
	dir = strings.Trim(dir, "/")
	prefix := s.Prefix
	if dir != "" {
		prefix = s.key(dir) + "/"
	}
	keys, err := s.list(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	var out []string
	seen := map[string]bool{}
	for _, k := range keys {
		rel := strings.TrimPrefix(k, prefix)
		if dir == "" && strings.HasPrefix(k, s.Locker.Prefix) {
			continue // lock objects are not storage keys
		}
		if !recursive {
			rel, _, _ = strings.Cut(rel, "/")
		}
		full := rel
		if dir != "" {
			full = dir + "/" + rel
		}
		if !seen[full] {
			seen[full] = true
			out = append(out, full)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("listing %s: %w", dir, fs.ErrNotExist)
	}
	return out, nil
}

// list returns every bucket key under prefix, following pagination.
func (s *Storage) list(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	token := ""
	for {
		page, err := s.Bucket.List(ctx, prefix, token)
		if err != nil {
			return nil, err
		}
		for _, o := range page.Objects {
			keys = append(keys, o.Key)
		}
		if page.NextToken == "" {
			return keys, nil
		}
		token = page.NextToken
	}
}

// SharedAcrossBoxes reports that every box on the bucket sees this storage, so per-box
// state (such as the derp_switch node key) must live elsewhere.
func (s *Storage) SharedAcrossBoxes() bool { return true }

// String describes the storage for logs.
func (s *Storage) String() string {
	return fmt.Sprintf("lchat storage %s/%s", s.Bucket, strings.TrimSuffix(s.Prefix, "/"))
}

// Interface guards
var (
	_ certmagic.Storage   = (*Storage)(nil)
	_ certmagic.TryLocker = (*Storage)(nil)
)
