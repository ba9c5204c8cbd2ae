package spacestore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/spacestore/pageread"
	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" driver for consistent snapshots
)

// sqliteHeader starts every SQLite database file.
var sqliteHeader = []byte("SQLite format 3\x00")

// Stats describes one checkpoint.
type Stats struct {
	Files         int
	BlobsUploaded int
	BytesUploaded int64
	// ManifestWritten is false when nothing changed: no write at all.
	ManifestWritten bool
	Duration        time.Duration
	// PagesChanged counts the SQLite pages found changed; FullScans the databases that had
	// to be read whole to find them (no usable WAL position).
	PagesChanged int
	FullScans    int
	// GC is set when this checkpoint also collected garbage (GCErr when that failed; the
	// checkpoint itself stands).
	GC    *GCStats
	GCErr error
	// HistoryErr is set when the manifest was written but its history entry was not: that
	// checkpoint cannot be restored to later.
	HistoryErr error
	// Skipped lists the files left out because they are not regular files (oddfiles.go).
	Skipped []SkippedFile
	// ReuseErr, after a Final format-2 checkpoint, says why the next wake on this box
	// cannot keep the data dir (reuse.go); nil when it can (or when nothing was tried).
	ReuseErr error
}

// Syncer moves one space's data directory to and from the bucket. It remembers the manifest
// and ETag this box last read or wrote, which every manifest write is conditioned on. A Syncer
// is used by one goroutine at a time (the engine's per-space operation lock).
type Syncer struct {
	Bucket    bucket.Bucket
	Host      string
	DataDir   string // the live data directory
	WorkDir   string // scratch space on the same filesystem as DataDir
	WrittenBy string // recorded in manifests
	// FullFile writes format 1: every changed file uploaded whole, SQLite databases through
	// VACUUM INTO. It is how main wrote before format 2, kept for side-by-side benchmarks.
	FullFile bool
	// Retention is how long checkpoints stay restorable (history and the objects it
	// references); default DefaultRetention.
	Retention time.Duration
	// GCGrace is how young an object or history entry must be to survive a collection this
	// box runs regardless of references; default DefaultGCGrace.
	GCGrace time.Duration
	// PageReader, when set, reads the SQLite databases in lchat-pageread under the space's
	// uid (pagereader.go); nil reads them in this process, for a space that runs as the
	// box's own user.
	PageReader *PageReader

	manifest *Manifest
	etag     string
	// claim is the lease this box fenced the manifest with since the last Load (claim.go);
	// its checkpoints carry it.
	claim *Claim
	// unsure is the body of this box's last manifest write whose outcome is unknown
	// (an error other than a lost swap): it may have landed (ambiguous.go).
	unsure []byte
	// hashes maps a file's stat fingerprint to its snapshot's content, so unchanged files
	// (and unchanged SQLite databases) are neither re-read nor re-uploaded.
	hashes map[string]File
	// readAt holds, by fingerprint, when a checkpoint read that content while the
	// instance ran (absent: read with it stopped, or written by Restore). See racy.
	readAt map[string]time.Time
	// known holds blob hashes known to exist in the bucket.
	known map[string]bool
	// dbs holds, by path, what this box knows of each database's last checkpointed image.
	dbs map[string]*dbState
	// gcAt is the generation of the last garbage collection this box ran.
	gcAt int64
	// histCache holds the references of history entries read by GC (they never change).
	histCache map[string][]Ref
	// reused: the last Restore kept the local data dir (reuse.go).
	reused bool
}

// Manifest returns the manifest this box last read or wrote (nil before Load or for a new
// space) and its ETag.
func (s *Syncer) Manifest() (*Manifest, string) { return s.manifest, s.etag }

// Unsure reports whether this syncer's last manifest write failed in a way that may have
// landed (its answer lost): the bucket may hold a newer generation than Manifest says,
// until a later write settles it (ambiguous.go).
func (s *Syncer) Unsure() bool { return s.unsure != nil }

// Load reads the current manifest; later writes are conditioned on its ETag.
func (s *Syncer) Load(ctx context.Context) error {
	m, etag, err := ReadManifest(ctx, s.Bucket, s.Host)
	if err != nil {
		return err
	}
	s.manifest, s.etag, s.unsure, s.claim = m, etag, nil, nil
	s.known = make(map[string]bool)
	if m != nil {
		for _, f := range m.Files {
			s.known[f.SHA256] = true
		}
	}
	return nil
}

// checkpointV1 is the format-1 (full-file) checkpoint: every changed file, SQLite databases
// included, is copied (VACUUM INTO) and uploaded whole as one blob.
func (s *Syncer) checkpointV1(ctx context.Context, nextWake *time.Time, now time.Time) (Stats, error) {
	start := time.Now()
	var st Stats
	if s.hashes == nil {
		s.hashes = make(map[string]File)
	}
	if s.known == nil {
		s.known = make(map[string]bool)
	}
	if err := os.MkdirAll(s.WorkDir, 0o700); err != nil {
		return st, err
	}
	snap, err := os.MkdirTemp(s.WorkDir, "snap-")
	if err != nil {
		return st, err
	}
	defer os.RemoveAll(snap)

	files, staged, skipped, err := s.snapshot(ctx, snap)
	st.Skipped = skipped
	if err != nil {
		return st, err
	}
	st.Files = len(files)
	if s.manifest != nil && slices.Equal(s.manifest.Files, files) && sameTime(s.manifest.NextWake, nextWake) {
		st.Duration = time.Since(start)
		return st, nil
	}
	for _, f := range files {
		if s.known[f.SHA256] {
			continue
		}
		n, err := s.upload(ctx, f, staged[f.SHA256])
		if err != nil {
			return st, err
		}
		if n > 0 {
			st.BlobsUploaded++
			st.BytesUploaded += n
		}
		s.known[f.SHA256] = true
	}
	m := &Manifest{Files: files, WrittenBy: s.WrittenBy, WrittenAt: now.UTC(), NextWake: nextWake, Claim: s.claim}
	if s.manifest != nil {
		m.Generation = s.manifest.Generation
	}
	m.Generation++
	etag, err := s.writeManifest(ctx, m)
	if err != nil {
		return st, err
	}
	s.manifest, s.etag = m, etag
	st.ManifestWritten = true
	st.Duration = time.Since(start)
	return st, nil
}

// upload puts one blob unless the bucket already has it; it returns the bytes sent.
func (s *Syncer) upload(ctx context.Context, f File, staged string) (int64, error) {
	key := BlobKey(s.Host, f.SHA256)
	if _, err := s.Bucket.Head(ctx, key); err == nil {
		return 0, nil
	} else if !errors.Is(err, bucket.ErrNotFound) {
		return 0, fmt.Errorf("checking blob of %s: %w", f.Path, err)
	}
	if staged == "" {
		return 0, fmt.Errorf("no staged copy of %s", f.Path)
	}
	in, err := os.Open(staged)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	_, err = s.Bucket.Put(ctx, key, in, f.Size, bucket.Cond{IfNoneMatch: true})
	if bucket.LostRace(err) {
		return 0, nil // content-addressed: someone stored the same bytes
	}
	if err != nil {
		return 0, fmt.Errorf("uploading blob of %s: %w", f.Path, err)
	}
	return f.Size, nil
}

// snapshot walks DataDir and returns its files (sorted by path) and, for contents the bucket
// may lack, a staged copy in dir keyed by hash. SQLite databases are copied with VACUUM INTO
// (a consistent read transaction), never byte-copied live; their -wal, -shm and -journal
// files are skipped. Symlinks, FIFOs, sockets and devices are skipped and listed.
func (s *Syncer) snapshot(ctx context.Context, dir string) (files []File, staged map[string]string, skipped []SkippedFile, err error) {
	staged = make(map[string]string)
	fresh := make(map[string]File)
	err = walkFiles(ctx, s.DataDir, &skipped, func(p, rel string, info fs.FileInfo, fp string) error {
		if f, ok := s.hashes[fp]; ok && s.known[f.SHA256] {
			f.Path, f.Mode = rel, uint32(info.Mode().Perm())
			files = append(files, f)
			fresh[fp] = f
			return nil
		}
		tmp := filepath.Join(dir, randHex(8))
		f, err := stage(ctx, p, tmp)
		if err != nil {
			os.Remove(tmp)
			if ctx.Err() == nil && gone(p) {
				return nil
			}
			return fmt.Errorf("snapshotting %s: %w", rel, err)
		}
		f.Path, f.Mode = rel, uint32(info.Mode().Perm())
		files = append(files, f)
		fresh[fp] = f
		if s.known[f.SHA256] || staged[f.SHA256] != "" {
			os.Remove(tmp)
		} else {
			staged[f.SHA256] = tmp
		}
		return nil
	})
	if err != nil {
		return nil, nil, skipped, err
	}
	s.hashes = fresh
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, staged, skipped, nil
}

// walkFiles calls visit for each regular file under dataDir, with its path, its path
// relative to dataDir (slash-separated), its info and its fingerprint. Directories and
// SQLite -wal, -shm and -journal files are passed over; symlinks, FIFOs, sockets and
// devices are appended to skipped. A file the instance removes while the walk runs is
// not part of it, and a data dir that does not exist is empty.
func walkFiles(ctx context.Context, dataDir string, skipped *[]SkippedFile, visit func(p, rel string, info fs.FileInfo, fp string) error) error {
	visited := false
	err := filepath.WalkDir(dataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != dataDir && errors.Is(err, fs.ErrNotExist) {
				return nil // removed by the instance while we walked: not part of this snapshot
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dataDir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if k := oddKind(d.Type()); k != "" {
			*skipped = append(*skipped, SkippedFile{Path: rel, Kind: k})
			return nil
		}
		if d.IsDir() || isSQLiteSidecar(dataDir, rel) {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed (or renamed away) after the directory was read
		}
		if err != nil {
			return err
		}
		fp, err := fingerprint(dataDir, rel)
		if err != nil {
			if gone(p) {
				return nil
			}
			return err
		}
		visited = true
		return visit(p, rel, info, fp)
	})
	if errors.Is(err, fs.ErrNotExist) && !visited {
		if _, serr := os.Stat(dataDir); errors.Is(serr, fs.ErrNotExist) {
			err = nil
		}
	}
	return err
}

// gone reports whether p no longer exists: the instance removed or renamed a file (a
// temporary one, typically) while a checkpoint was reading its directory. Such a file is
// simply not part of the snapshot rather than a failed checkpoint.
func gone(p string) bool {
	_, err := os.Lstat(p)
	return errors.Is(err, fs.ErrNotExist)
}

// stage copies src to dst consistently and hashes the copy.
func stage(ctx context.Context, src, dst string) (File, error) {
	isDB, err := isSQLite(src)
	if err != nil {
		return File{}, err
	}
	if isDB {
		if err := vacuumInto(ctx, src, dst); err != nil {
			return File{}, err
		}
		return hashFile(dst)
	}
	in, err := os.Open(src)
	if err != nil {
		return File{}, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return File{}, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return File{}, err
	}
	return File{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

func vacuumInto(ctx context.Context, src, dst string) error {
	db, err := sql.Open("sqlite", sqliteURI(src))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", dst); err != nil {
		return fmt.Errorf("vacuum into: %v", err)
	}
	return normalizeHeader(src, dst)
}

// normalizeHeader makes a VACUUM INTO copy a function of the database's content alone, so an
// unchanged database hashes the same at every checkpoint and is not uploaded again. VACUUM INTO
// stamps counters that change on every run: the file change counter (offset 24), the schema
// cookie (40) and version-valid-for (92); a copy is opened afresh by the next wake, never by a
// connection that cached them, so fixed values are as valid. The journal-mode bytes (18, 19)
// are taken from the live database, keeping a WAL database in WAL mode after restore.
func normalizeHeader(src, dst string) error {
	mode := make([]byte, 2)
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	_, err = in.ReadAt(mode, 18)
	in.Close()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	one := []byte{0, 0, 0, 1}
	for _, w := range []struct {
		off int64
		b   []byte
	}{{18, mode}, {24, one}, {40, one}, {92, one}} {
		if _, err := out.WriteAt(w.b, w.off); err != nil {
			out.Close()
			return err
		}
	}
	return out.Close()
}

// sqliteURI names the database at path p for the driver (pageread.SQLiteURI).
func sqliteURI(p string) string { return pageread.SQLiteURI(p) }

func hashFile(p string) (File, error) {
	f, err := os.Open(p)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return File{}, err
	}
	return File{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

func isSQLite(p string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, len(sqliteHeader))
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return false, err
	}
	return n == len(buf) && bytes.Equal(buf, sqliteHeader), nil
}

var sidecarSuffixes = []string{"-wal", "-shm", "-journal"}

// isSQLiteSidecar reports whether rel is the WAL, shared-memory or rollback journal of a
// SQLite database beside it.
func isSQLiteSidecar(root, rel string) bool {
	for _, suf := range sidecarSuffixes {
		if base, ok := strings.CutSuffix(rel, suf); ok && path.Base(base) != "" {
			if db, err := isSQLite(filepath.Join(root, filepath.FromSlash(base))); err == nil && db {
				return true
			}
		}
	}
	return false
}

// fingerprint identifies a file's current content without reading it: inode, size, mtime and
// ctime of the file and of its SQLite sidecars (a WAL write leaves the main file untouched).
// ctime cannot be set by the instance, so a rewrite with a forged mtime is still noticed.
func fingerprint(root, rel string) (string, error) {
	var b strings.Builder
	b.WriteString(rel)
	for i, suf := range append([]string{""}, sidecarSuffixes...) {
		fi, err := os.Lstat(filepath.Join(root, filepath.FromSlash(rel+suf)))
		if err != nil {
			if i > 0 && errors.Is(err, fs.ErrNotExist) {
				b.WriteString("|-")
				continue
			}
			return "", err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st == nil {
			return "", fmt.Errorf("no stat for %s", rel)
		}
		fmt.Fprintf(&b, "|%d:%d:%d:%d:%d.%d:%o", st.Dev, st.Ino, fi.Size(), fi.ModTime().UnixNano(), st.Ctim.Sec, st.Ctim.Nsec, fi.Mode())
	}
	return b.String(), nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
