package spacestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// fetchConcurrency is how many objects a restore downloads at once.
const fetchConcurrency = 8

// Restore downloads the loaded manifest's files into a fresh directory and swaps it in as
// DataDir; with no manifest, DataDir becomes empty. Objects are fetched in parallel and each
// is hashed and written while it downloads; a database's deltas are applied once its base is
// down, and its page checksum verified. A database's objects are checked by that page
// checksum (and a delta by its LTX file checksum) rather than hashed a second time with
// SHA-256, which would cost a wake more CPU than anything else it does.
//
// When a final checkpoint on this box left the data dir provably equal to the loaded
// manifest, and nothing changed it since, the data dir is kept as it is (reuse.go).
func (s *Syncer) Restore(ctx context.Context) error {
	s.reused = false
	if s.reuse() {
		s.reused = true
		return nil
	}
	if err := s.dropReuse(); err != nil {
		return err
	}
	if err := os.MkdirAll(s.WorkDir, 0o700); err != nil {
		return err
	}
	var files []File
	if s.manifest != nil {
		files = s.manifest.Files
	}
	var dbs map[string]*dbState
	if ownFS, err := s.dataDirOnItsOwnFS(); err != nil {
		return err
	} else if ownFS {
		dbs, err = s.restoreInPlace(ctx, files)
		if err != nil {
			return err
		}
	} else {
		dbs, err = s.restoreAndSwap(ctx, files)
		if err != nil {
			return err
		}
	}
	s.seedCaches(files, dbs)
	return nil
}

// seedCaches takes the data dir as holding exactly files, with the databases' page states
// dbs: a restore just wrote them.
func (s *Syncer) seedCaches(files []File, dbs map[string]*dbState) {
	s.hashes, s.readAt = make(map[string]File), nil
	for _, f := range files {
		if fp, err := fingerprint(s.DataDir, f.Path); err == nil {
			s.hashes[fp] = f
		}
		if st := dbs[f.Path]; st != nil {
			if fi, err := os.Stat(filepath.Join(s.DataDir, filepath.FromSlash(f.Path))); err == nil {
				st.dev, st.ino = statID(fi)
			}
		}
	}
	s.dbs = dbs
}

// restoreAndSwap fetches files into a fresh directory in WorkDir and renames it over
// DataDir: a crash leaves either the old data dir or the new one.
func (s *Syncer) restoreAndSwap(ctx context.Context, files []File) (map[string]*dbState, error) {
	fresh, err := os.MkdirTemp(s.WorkDir, "restore-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(fresh)
	dbs := make(map[string]*dbState)
	if len(files) > 0 {
		if dbs, err = restoreFiles(ctx, s, fresh, files); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(fresh, 0o700); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(s.DataDir), 0o700); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(s.DataDir); err == nil {
		old := filepath.Join(s.WorkDir, "old-"+randHex(6))
		if err := os.Rename(s.DataDir, old); err != nil {
			return nil, fmt.Errorf("moving old data dir aside: %v", err)
		}
		defer os.RemoveAll(old)
	}
	if err := os.Rename(fresh, s.DataDir); err != nil {
		return nil, fmt.Errorf("swapping in restored data dir: %v", err)
	}
	return dbs, nil
}

// dataDirOnItsOwnFS reports whether DataDir is a directory on another filesystem than
// WorkDir: a space's disk image, bind-mounted there, which a rename can neither move
// aside nor replace, and whose size is the space's limit.
func (s *Syncer) dataDirOnItsOwnFS() (bool, error) {
	dfi, err := os.Lstat(s.DataDir)
	if err != nil || !dfi.IsDir() {
		return false, nil
	}
	wfi, err := os.Stat(s.WorkDir)
	if err != nil {
		return false, err
	}
	ddev, _ := statID(dfi)
	wdev, _ := statID(wfi)
	return ddev != wdev, nil
}

// restoreInPlace empties DataDir and fetches files straight into it. The old files go
// first, so a space at its disk limit can be restored: they are worth nothing once
// Restore runs (the caller keeps a data dir newer than the manifest rather than restore
// over it), and the reuse record is already gone, so a crash or failure midway leaves a
// data dir that the next wake restores again.
func (s *Syncer) restoreInPlace(ctx context.Context, files []File) (map[string]*dbState, error) {
	ents, err := os.ReadDir(s.DataDir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(s.DataDir, e.Name())); err != nil {
			return nil, fmt.Errorf("emptying the data dir: %v", err)
		}
	}
	dbs := make(map[string]*dbState)
	if len(files) > 0 {
		if dbs, err = restoreFiles(ctx, s, s.DataDir, files); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(s.DataDir, 0o700); err != nil {
		return nil, err
	}
	return dbs, nil
}

type fetch struct {
	ref Ref
	out *os.File // written at off; nil: kept in mem
	off int64
	mem []byte
	// pages, for a database's base chunk, receives the hash of every page written.
	pages *pageHasher
	// checked: the content is verified by other means (a database's page checksum, an LTX
	// file's own checksum), so the object is not hashed with SHA-256 as well; its size is
	// still checked.
	checked bool
}

// pageHasher hashes the pages of a base chunk as they stream past, into hashes (shared by
// the chunks of one database; each chunk owns its own range of it).
type pageHasher struct {
	hashes   []uint64
	pageSize int
	next     uint32 // pgno of the page being filled
	buf      []byte
}

func (h *pageHasher) Write(p []byte) (int, error) {
	n := len(p)
	for len(h.buf) == 0 && len(p) >= h.pageSize {
		if int(h.next) <= len(h.hashes) {
			h.hashes[h.next-1] = pageHash(h.next, p[:h.pageSize])
		}
		h.next++
		p = p[h.pageSize:]
	}
	for len(p) > 0 {
		take := min(len(p), h.pageSize-len(h.buf))
		h.buf = append(h.buf, p[:take]...)
		p = p[take:]
		if len(h.buf) == h.pageSize {
			if int(h.next) <= len(h.hashes) {
				h.hashes[h.next-1] = pageHash(h.next, h.buf)
			}
			h.next++
			h.buf = h.buf[:0]
		}
	}
	return n, nil
}

// restoreFiles writes files under root and returns the states of their databases.
func restoreFiles(ctx context.Context, s *Syncer, root string, files []File) (map[string]*dbState, error) {
	var jobs []*fetch
	type dbFile struct {
		f      File
		out    *os.File
		deltas []*fetch
		hashes []uint64
	}
	var outs []*os.File
	defer func() {
		for _, o := range outs {
			o.Close()
		}
	}()
	var dbFiles []dbFile
	for _, f := range files {
		if !fs.ValidPath(f.Path) || f.Path == "." {
			return nil, fmt.Errorf("manifest names an invalid path %q", f.Path)
		}
		dst := filepath.Join(root, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return nil, err
		}
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_RDWR, fs.FileMode(f.Mode&0o777)|0o600)
		if err != nil {
			return nil, err
		}
		outs = append(outs, out)
		if err := allocate(out, f.Size); err != nil {
			return nil, err
		}
		if f.Content != nil && f.Content.DB != nil {
			img := f.Content.DB
			d := dbFile{f: f, out: out, hashes: make([]uint64, img.Pages)}
			per := uint32(img.ChunkBytes / int64(img.PageSize))
			for i, r := range img.Base {
				ph := &pageHasher{hashes: d.hashes, pageSize: img.PageSize, next: uint32(i)*per + 1, buf: make([]byte, 0, img.PageSize)}
				jobs = append(jobs, &fetch{ref: r, out: out, off: int64(i) * img.ChunkBytes, pages: ph, checked: true})
			}
			for _, dr := range img.Deltas {
				j := &fetch{ref: dr.Ref, checked: true}
				d.deltas = append(d.deltas, j)
				jobs = append(jobs, j)
			}
			dbFiles = append(dbFiles, d)
			continue
		}
		var off int64
		for _, r := range f.refs() {
			jobs = append(jobs, &fetch{ref: r, out: out, off: off})
			off += r.Size
		}
	}
	if err := fetchAll(ctx, s, jobs); err != nil {
		return nil, err
	}
	dbs := make(map[string]*dbState)
	for _, d := range dbFiles {
		img := d.f.Content.DB
		var pages [][]uint32
		for _, j := range d.deltas {
			ps, err := applyDelta(d.out, j.mem, img, d.hashes)
			if err != nil {
				return nil, fmt.Errorf("restoring %s: %w", d.f.Path, err)
			}
			pages = append(pages, ps)
		}
		if err := d.out.Truncate(d.f.Size); err != nil {
			return nil, err
		}
		st := &dbState{img: img, hashes: d.hashes, deltaPages: pages}
		for _, h := range d.hashes {
			st.sum ^= h
		}
		if strconv.FormatUint(st.sum, 16) != img.Checksum {
			return nil, fmt.Errorf("restoring %s: database fails its checksum: %x, manifest says %s", d.f.Path, st.sum, img.Checksum)
		}
		dbs[d.f.Path] = st
	}
	for i, f := range files {
		if f.Content == nil && !s.FullFile {
			if st := adoptV1(outs[i].Name(), f); st != nil {
				dbs[f.Path] = st
			}
		}
		if err := outs[i].Close(); err != nil {
			return nil, err
		}
		if err := os.Chmod(outs[i].Name(), fs.FileMode(f.Mode&0o777)); err != nil {
			return nil, err
		}
	}
	outs = nil
	return dbs, nil
}

// fetchAll downloads jobs, fetchConcurrency at a time, verifying each object's size and hash.
func fetchAll(ctx context.Context, s *Syncer, jobs []*fetch) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan *fetch)
	for range min(fetchConcurrency, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				if err := s.fetchOne(ctx, j); err != nil {
					mu.Lock()
					if first == nil {
						first = err
						cancel()
					}
					mu.Unlock()
				}
			}
		}()
	}
feed:
	for _, j := range jobs {
		select {
		case next <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

func (s *Syncer) fetchOne(ctx context.Context, j *fetch) error {
	obj, err := s.Bucket.Get(ctx, RefKey(s.Host, j.ref))
	if err != nil {
		return fmt.Errorf("downloading %s: %w", j.ref.Key, err)
	}
	defer obj.Body.Close()
	var w io.Writer
	var buf *bytes.Buffer
	if j.out != nil {
		w = io.NewOffsetWriter(j.out, j.off)
		if j.pages != nil {
			w = io.MultiWriter(w, j.pages)
		}
	} else {
		buf = bytes.NewBuffer(make([]byte, 0, j.ref.Size))
		w = buf
	}
	// One byte past the expected size is enough to know the object is wrong; a bad object
	// never fills the disk.
	h := sha256.New()
	if !j.checked {
		w = io.MultiWriter(w, h)
	}
	bp := fetchBufs.Get().(*[]byte)
	defer fetchBufs.Put(bp)
	n, err := copyFull(w, io.LimitReader(obj.Body, j.ref.Size+1), *bp)
	if err != nil {
		return fmt.Errorf("downloading %s: %w", j.ref.Key, err)
	}
	if n != j.ref.Size {
		return fmt.Errorf("object %s is corrupt: size %d, manifest says %d", j.ref.Key, n, j.ref.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); !j.checked && got != j.ref.SHA256 {
		return fmt.Errorf("object %s is corrupt: sha256 %s, manifest says %s", j.ref.Key, got, j.ref.SHA256)
	}
	if buf != nil {
		j.mem = buf.Bytes()
	}
	return nil
}

// fetchBuffer is how much of an object a restore gathers before writing it out: a multiple
// of every page size, so base chunks are written and hashed in whole pages, with few writes
// (concurrent writes to one file take turns on its inode lock).
const fetchBuffer = 1 << 20

// fetchBufs keeps the buffers between objects and wakes.
var fetchBufs = sync.Pool{New: func() any { b := make([]byte, fetchBuffer); return &b }}

// copyFull copies r to w in writes of len(buf) bytes (the last one shorter), unlike
// io.Copy, which writes whatever each socket read returned.
func copyFull(w io.Writer, r io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		k, err := io.ReadFull(r, buf)
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
