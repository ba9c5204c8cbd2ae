// Package filebucket is a bucket.Bucket kept in a local directory: the embedded default
// for one machine. It keeps S3's semantics across processes on that machine: a write is
// published by an atomic rename of a synced temporary file, conditional writes are
// serialized by flock(2) on lock files shared by every process using the same root, and
// ETags are content hashes quoted like S3's ("<md5 hex>"), so callers can hand an ETag
// they got back to an If-Match write on either backend the same way.
//
// Layout: the object "k" lives at <root>/<prefix>/k; <root>/.lchat-bucket/ holds the
// lock files and temporary files. A key and a key under it ("a" and "a/b") cannot both
// exist, because one would be a file and the other a directory; such a write fails with
// an error naming the keys.
package filebucket

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/bucket"
)

// PageSize is the most keys one List call returns, as with S3's ListObjectsV2.
const PageSize = 1000

// MetaDir is the directory under a root that holds the bucket's lock and temporary
// files, created by New.
const MetaDir = metaDir

const (
	// metaDir holds lock and temporary files under the root. Keys cannot start with it.
	metaDir = ".lchat-bucket"
	// lockStripes bounds the number of lock files: keys hash onto them. Two keys sharing
	// a stripe only serialize their writes; correctness does not depend on the count.
	lockStripes = 256
	// xattrETag caches an object's ETag with the size and mtime it was computed for,
	// set on the temporary file before the rename publishes it.
	xattrETag = "user.lchat.etag"
	// staleTemp is the age after which a leftover temporary file (from a crashed
	// writer) is removed when a Bucket opens the root.
	staleTemp = time.Hour
)

// Bucket is a directory-backed bucket. It is safe for concurrent use, also by several
// processes sharing the root.
type Bucket struct {
	root   string // absolute, clean
	prefix string // cleaned; "" or without surrounding slashes
}

// New opens (creating if needed) a bucket rooted at the directory root. It fails, naming
// the path, when the directory cannot be created or written.
func New(root string) (*Bucket, error) {
	if root == "" {
		return nil, errors.New("filebucket: root is required")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("filebucket: resolving root %s: %v", root, err)
	}
	// Owner only: objects hold spaces' data and certificate keys, and their names are
	// the hosts of the fleet. Objects are created 0600 (os.CreateTemp).
	for _, d := range []string{abs, filepath.Join(abs, metaDir, "tmp"), filepath.Join(abs, metaDir, "locks")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("filebucket: creating directory %s: %v", d, err)
		}
	}
	b := &Bucket{root: abs}
	probe, err := os.CreateTemp(b.tmpDir(), "probe-*")
	if err != nil {
		return nil, fmt.Errorf("filebucket: root %s is not writable: %v", abs, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	b.removeStaleTemps()
	return b, nil
}

// Sub returns a bucket for the keys under prefix within b. It shares b's root and lock
// files, so conditional writes through either see each other.
func (b *Bucket) Sub(prefix string) (*Bucket, error) {
	p, err := bucket.CleanPrefix(prefix)
	if err != nil {
		return nil, fmt.Errorf("filebucket: %w", err)
	}
	if p == "" {
		return b, nil
	}
	full := bucket.JoinPrefix(b.prefix, p)
	if first, _, _ := strings.Cut(full, "/"); first == metaDir {
		return nil, fmt.Errorf("filebucket: prefix %q: %w: %s is reserved", p, bucket.ErrInvalidKey, metaDir)
	}
	return &Bucket{root: b.root, prefix: full}, nil
}

// Root is the directory the bucket lives in.
func (b *Bucket) Root() string { return b.root }

// String describes the bucket as a file URL.
func (b *Bucket) String() string {
	if b.prefix == "" {
		return "file://" + b.root
	}
	return "file://" + b.root + " prefix " + b.prefix
}

func (b *Bucket) tmpDir() string { return filepath.Join(b.root, metaDir, "tmp") }

func (b *Bucket) removeStaleTemps() {
	entries, err := os.ReadDir(b.tmpDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTemp {
			os.Remove(filepath.Join(b.tmpDir(), e.Name()))
		}
	}
}

// full maps a key to its path relative to the root (slash-separated) and on disk.
func (b *Bucket) full(key string) (rel, path string, err error) {
	if err := bucket.CheckKey(key); err != nil {
		return "", "", fmt.Errorf("filebucket: %w", err)
	}
	rel = bucket.JoinPrefix(b.prefix, key)
	if first, _, _ := strings.Cut(rel, "/"); first == metaDir {
		return "", "", fmt.Errorf("filebucket: %w: %q: %s is reserved", bucket.ErrInvalidKey, key, metaDir)
	}
	return rel, filepath.Join(b.root, filepath.FromSlash(rel)), nil
}

// lock takes the exclusive flock of rel's stripe. Every write (conditional or not) and
// every delete of a key holds it, so a compare and the rename that follows are atomic
// with respect to all other writers, in this process and in others.
func (b *Bucket) lock(rel string) (unlock func(), err error) {
	h := fnv.New32a()
	io.WriteString(h, rel)
	name := filepath.Join(b.root, metaDir, "locks", fmt.Sprintf("%02x", h.Sum32()%lockStripes))
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("filebucket: opening lock file: %v", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("filebucket: locking %s: %v", name, err)
	}
	// Closing the descriptor releases the flock.
	return func() { f.Close() }, nil
}

func quoteETag(sum []byte) string { return `"` + hex.EncodeToString(sum) + `"` }

// etagEqual compares ETags the way S3 does for If-Match: quotes and a weak prefix are
// not part of the value.
func etagEqual(a, b string) bool {
	norm := func(s string) string {
		return strings.Trim(strings.TrimPrefix(strings.TrimSpace(s), "W/"), `"`)
	}
	return norm(a) != "" && norm(a) == norm(b)
}

// cachedETag returns the ETag recorded on f if it was recorded for f's current size
// and mtime. xattr helpers take a descriptor so the value belongs to the opened file.
func cachedETag(f *os.File, fi fs.FileInfo) (string, bool) {
	buf := make([]byte, 128)
	n, err := unix.Fgetxattr(int(f.Fd()), xattrETag, buf)
	if err != nil {
		return "", false
	}
	fields := strings.Fields(string(buf[:n]))
	if len(fields) != 3 {
		return "", false
	}
	size, err1 := strconv.ParseInt(fields[1], 10, 64)
	mtime, err2 := strconv.ParseInt(fields[2], 10, 64)
	if err1 != nil || err2 != nil || size != fi.Size() || mtime != fi.ModTime().UnixNano() {
		return "", false
	}
	return fields[0], true
}

// fileETag returns f's ETag, from the cache when valid, else by hashing the content
// (a file placed or edited outside the bucket). It leaves f's offset at 0.
func fileETag(f *os.File, fi fs.FileInfo) (string, error) {
	if etag, ok := cachedETag(f, fi); ok {
		return etag, nil
	}
	h := md5.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, fi.Size())); err != nil {
		return "", err
	}
	return quoteETag(h.Sum(nil)), nil
}

// open opens path and describes it. A missing file, or a directory, is ErrNotFound.
func (b *Bucket) open(key, path string) (*os.File, bucket.Info, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, bucket.Info{}, fmt.Errorf("filebucket: %s: %w", key, bucket.ErrNotFound)
		}
		return nil, bucket.Info{}, fmt.Errorf("filebucket: opening %s: %v", key, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		f.Close()
		return nil, bucket.Info{}, fmt.Errorf("filebucket: %s: %w", key, bucket.ErrNotFound)
	}
	var etag string
	if err == nil {
		etag, err = fileETag(f, fi)
	}
	if err != nil {
		f.Close()
		return nil, bucket.Info{}, fmt.Errorf("filebucket: reading %s: %v", key, err)
	}
	return f, bucket.Info{Key: key, Size: fi.Size(), ETag: etag, LastModified: fi.ModTime()}, nil
}

// Get streams an object from its open file: a concurrent replace does not change
// the bytes a reader already opened.
func (b *Bucket) Get(ctx context.Context, key string) (*bucket.Object, error) {
	_, path, err := b.full(key)
	if err != nil {
		return nil, err
	}
	f, info, err := b.open(key, path)
	if err != nil {
		return nil, err
	}
	return &bucket.Object{Info: info, Body: f}, nil
}

// Head returns an object's metadata.
func (b *Bucket) Head(ctx context.Context, key string) (bucket.Info, error) {
	_, path, err := b.full(key)
	if err != nil {
		return bucket.Info{}, err
	}
	f, info, err := b.open(key, path)
	if err != nil {
		return bucket.Info{}, err
	}
	f.Close()
	return info, nil
}

// ctxReader stops a streaming copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Put streams body into a temporary file, syncs it, then under the key's lock checks
// cond and renames the file into place. The body is never held in memory. A conditional
// write is checked once before all that too: one that already fails costs no temporary
// file and no sync (the answer is the key's state while Put ran, as S3's is).
func (b *Bucket) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	rel, path, err := b.full(key)
	if err != nil {
		return bucket.Info{}, err
	}
	if err := b.checkCond(key, path, cond); errors.Is(err, bucket.ErrPreconditionFailed) {
		// Without the lock: a failed precondition seen is one, and one that passes
		// here is checked again under the lock below.
		return bucket.Info{}, err
	}
	tmp, err := os.CreateTemp(b.tmpDir(), "put-*")
	if err != nil {
		return bucket.Info{}, fmt.Errorf("filebucket: creating temporary file: %v", err)
	}
	published := false
	defer func() {
		if !published {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := md5.New()
	var src io.Reader = ctxReader{ctx, body}
	if size >= 0 {
		// One byte past size is enough to tell a long body; a runaway one does not
		// fill the disk.
		src = io.LimitReader(src, size+1)
	}
	n, err := io.Copy(io.MultiWriter(tmp, h), src)
	if err != nil {
		return bucket.Info{}, fmt.Errorf("filebucket: writing %s: %w", key, err)
	}
	if size >= 0 && n != size {
		return bucket.Info{}, fmt.Errorf("filebucket: writing %s: body is not the expected %d bytes", key, size)
	}
	if err := tmp.Sync(); err != nil {
		return bucket.Info{}, fmt.Errorf("filebucket: syncing %s: %v", key, err)
	}
	fi, err := tmp.Stat()
	if err != nil {
		return bucket.Info{}, fmt.Errorf("filebucket: writing %s: %v", key, err)
	}
	etag := quoteETag(h.Sum(nil))
	// A filesystem without user xattrs only costs a rehash on reads.
	_ = unix.Fsetxattr(int(tmp.Fd()), xattrETag, []byte(fmt.Sprintf("%s %d %d", etag, fi.Size(), fi.ModTime().UnixNano())), 0)
	if err := tmp.Close(); err != nil {
		return bucket.Info{}, fmt.Errorf("filebucket: writing %s: %v", key, err)
	}

	unlock, err := b.lock(rel)
	if err != nil {
		return bucket.Info{}, err
	}
	defer unlock()
	if err := b.checkCond(key, path, cond); err != nil {
		return bucket.Info{}, err
	}
	if err := b.publishLocked(key, tmp.Name(), path); err != nil {
		return bucket.Info{}, err
	}
	published = true
	return bucket.Info{Key: key, Size: n, ETag: etag, LastModified: fi.ModTime()}, nil
}

// checkCond evaluates cond against the key's current state. Writes and deletes hold the
// key's lock around it and their rename or remove, so the answer holds for that.
func (b *Bucket) checkCond(key, path string, cond bucket.Cond) error {
	if !cond.IfNoneMatch && cond.IfMatch == "" {
		return nil
	}
	f, info, err := b.open(key, path)
	switch {
	case errors.Is(err, bucket.ErrNotFound):
		if cond.IfMatch != "" {
			return fmt.Errorf("filebucket: %s: If-Match on a missing key: %w", key, bucket.ErrPreconditionFailed)
		}
		return nil
	case err != nil:
		return err
	}
	f.Close()
	if cond.IfNoneMatch {
		return fmt.Errorf("filebucket: %s exists: %w", key, bucket.ErrPreconditionFailed)
	}
	if !etagEqual(info.ETag, cond.IfMatch) {
		return fmt.Errorf("filebucket: %s: ETag is %s, not %s: %w", key, info.ETag, cond.IfMatch, bucket.ErrPreconditionFailed)
	}
	return nil
}

// publishLocked renames tmp over path and syncs the directory so the new name is
// durable. A concurrent delete may remove the (empty) parent directory between the
// MkdirAll and the rename; then both are tried again.
func (b *Bucket) publishLocked(key, tmp, path string) error {
	dir := filepath.Dir(path)
	var err error
	for range 10 {
		if err = b.mkdirAllDurable(dir); err != nil {
			if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("filebucket: writing %s: a key that is a prefix of it exists: %v", key, err)
			}
			return fmt.Errorf("filebucket: writing %s: %v", key, err)
		}
		err = os.Rename(tmp, path)
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		if fi, serr := os.Stat(path); serr == nil && fi.IsDir() {
			return fmt.Errorf("filebucket: writing %s: keys under %s/ exist", key, key)
		}
		return fmt.Errorf("filebucket: writing %s: %v", key, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("filebucket: syncing directory of %s: %v", key, err)
	}
	return nil
}

// mkdirAllDurable creates dir and its missing parents, syncing the parent of each
// directory it creates: the new object's name is only durable if the names of the
// directories leading to it are too.
func (b *Bucket) mkdirAllDurable(dir string) error {
	var created []string
	for d := dir; d != b.root && strings.HasPrefix(d, b.root+string(filepath.Separator)); d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		}
		created = append(created, d)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, d := range created {
		// A concurrent delete may have removed an empty parent again; the rename
		// then fails with ENOENT and publishLocked tries both again.
		if err := syncDir(filepath.Dir(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Delete removes key. With cond.IfMatch, a missing key or another ETag is
// ErrPreconditionFailed. Parent directories left empty are removed.
func (b *Bucket) Delete(ctx context.Context, key string, cond bucket.Cond) error {
	rel, path, err := b.full(key)
	if err != nil {
		return err
	}
	unlock, err := b.lock(rel)
	if err != nil {
		return err
	}
	defer unlock()
	if err := b.checkCond(key, path, bucket.Cond{IfMatch: cond.IfMatch}); err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil && fi.IsDir() {
		return nil // only keys under it exist; the key itself does not
	}
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil
		}
		return fmt.Errorf("filebucket: deleting %s: %v", key, err)
	}
	dir := filepath.Dir(path)
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("filebucket: syncing directory of %s: %v", key, err)
	}
	// Best effort: a non-empty directory stays, and a writer racing us retries.
	for dir != b.root && strings.HasPrefix(dir, b.root) {
		if os.Remove(dir) != nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	return nil
}

// Copy copies src to dst, streaming from src's open file.
func (b *Bucket) Copy(ctx context.Context, src, dst string) (bucket.Info, error) {
	_, path, err := b.full(src)
	if err != nil {
		return bucket.Info{}, err
	}
	if _, _, err := b.full(dst); err != nil {
		return bucket.Info{}, err
	}
	f, info, err := b.open(src, path)
	if err != nil {
		return bucket.Info{}, err
	}
	defer f.Close()
	return b.Put(ctx, dst, f, info.Size, bucket.Cond{})
}

// List returns up to PageSize keys under prefix after token, in lexical order of the
// keys (a directory's entries sort as "name/", so the walk yields keys in order).
func (b *Bucket) List(ctx context.Context, prefix, token string) (bucket.ListPage, error) {
	if err := bucket.CheckPrefix(prefix); err != nil {
		return bucket.ListPage{}, fmt.Errorf("filebucket: %w", err)
	}
	after := ""
	if token != "" {
		raw, err := base64.RawURLEncoding.DecodeString(token)
		if err != nil {
			return bucket.ListPage{}, fmt.Errorf("filebucket: malformed list token")
		}
		after = bucket.JoinPrefix(b.prefix, string(raw))
	}
	fullPrefix := bucket.JoinPrefix(b.prefix, prefix)
	w := walker{b: b, ctx: ctx, prefix: fullPrefix, after: after}
	startDir := fullPrefix[:strings.LastIndex(fullPrefix, "/")+1] // "" or ends in "/"
	if err := w.walk(startDir); err != nil && err != errPageFull {
		return bucket.ListPage{}, err
	}
	page := bucket.ListPage{Now: time.Now()}
	if len(w.found) > PageSize {
		w.found = w.found[:PageSize]
		last := w.found[PageSize-1].Key
		page.NextToken = base64.RawURLEncoding.EncodeToString([]byte(last))
	}
	page.Objects = w.found
	return page, nil
}

var errPageFull = errors.New("page full")

type walker struct {
	b      *Bucket
	ctx    context.Context
	prefix string // full (with the bucket prefix) listing prefix
	after  string // full key to start after, or ""
	found  []bucket.Info
}

type entry struct {
	name, sortKey string
	dir           bool
}

// walk visits dir (a slash-terminated path relative to the root, or "") and collects
// matching keys until one more than a page is found.
func (w *walker) walk(dir string) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	des, err := os.ReadDir(filepath.Join(w.b.root, filepath.FromSlash(dir)))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil // removed by a concurrent delete, or no such prefix
		}
		return fmt.Errorf("filebucket: listing %s: %v", dir, err)
	}
	entries := make([]entry, 0, len(des))
	for _, de := range des {
		if dir == "" && de.Name() == metaDir {
			continue
		}
		switch {
		case de.IsDir():
			entries = append(entries, entry{de.Name(), dir + de.Name() + "/", true})
		case de.Type().IsRegular():
			entries = append(entries, entry{de.Name(), dir + de.Name(), false})
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].sortKey < entries[j].sortKey })
	for _, e := range entries {
		k := e.sortKey
		if e.dir {
			// Descend only where keys can both match the prefix and sort after the token.
			if !strings.HasPrefix(k, w.prefix) && !strings.HasPrefix(w.prefix, k) {
				continue
			}
			if w.after != "" && w.after >= k && !strings.HasPrefix(w.after, k) {
				continue
			}
			if err := w.walk(k); err != nil {
				return err
			}
			continue
		}
		if !strings.HasPrefix(k, w.prefix) || (w.after != "" && k <= w.after) {
			continue
		}
		info, ok, err := w.info(k)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		w.found = append(w.found, info)
		if len(w.found) > PageSize {
			return errPageFull
		}
	}
	return nil
}

func (w *walker) info(rel string) (bucket.Info, bool, error) {
	key := rel
	if w.b.prefix != "" {
		key = strings.TrimPrefix(rel, w.b.prefix+"/")
	}
	f, info, err := w.b.open(key, filepath.Join(w.b.root, filepath.FromSlash(rel)))
	if errors.Is(err, bucket.ErrNotFound) {
		return bucket.Info{}, false, nil
	}
	if err != nil {
		return bucket.Info{}, false, err
	}
	f.Close()
	return info, true, nil
}

// Interface guards
var _ bucket.Bucket = (*Bucket)(nil)
