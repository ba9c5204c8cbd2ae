package spacestore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// A wake on the box a space slept on (HRW placement sends it back there) need not download
// what is already on disk. After a final checkpoint that leaves the data dir exactly equal to
// the manifest it wrote, the Syncer records that manifest (generation, ETag, a hash of its
// file list) and a stat signature of every name in the data dir (reuseFile, in WorkDir, which
// the space's uid cannot write). Restore takes the record and removes it before anything
// else; it keeps the data dir as it is only when the record names exactly the manifest just
// loaded, the machine has not rebooted since (bootID) and the data dir's signature is
// unchanged. Any doubt is a full restore.
//
// What "exactly equal" takes, checked when the record is written:
//   - every manifest entry is format 2 (a format-1 blob of a database is a VACUUM INTO copy,
//     not the bytes on disk), and every name in the data dir is a regular file of the
//     manifest (same size and permission bits, no other mode bits, one link) or a directory
//     holding one: no symlink, FIFO, SQLite -wal/-shm/-journal, empty directory or other file;
//   - each file's fingerprint is the one the checkpoint read it under (so its content is the
//     manifest's; a final checkpoint reads again any file a write may have slipped past its
//     cache, see racy), or, for a database whose WAL the checkpoint's own connection moved
//     into the file, every page hashes as the checkpoint read it; and a database's page
//     hashes XOR to the image's checksum.
//
// The signature (inode, size, mtime, ctime, mode, links, owner of every name, taken with
// Lstat, never following a link) catches any change made after the record: a write, a
// rename, a chmod or a touch all move ctime, which no unprivileged process can set. The
// instance has stopped (its cgroup is gone) before the final checkpoint runs, so what that
// checkpoint read is the final state.

// reuseFile is the record's name in WorkDir.
const reuseFile = "reuse.json"

// reuseRecord is what a final checkpoint leaves for the next wake on this box.
type reuseRecord struct {
	Host       string        `json:"host"`
	BootID     string        `json:"boot_id"`
	DataDir    string        `json:"data_dir"`
	Generation int64         `json:"generation"`
	ETag       string        `json:"etag"`
	FilesHash  string        `json:"files_hash"`
	Names      []string      `json:"names"` // stat signature, one line per name, sorted
	DBs        []reuseDBInfo `json:"dbs,omitempty"`
	// Files is the manifest's file list, so that a later manifest can be restored over
	// this data dir by what changed (warm.go). FilesHash is its hash.
	Files []File `json:"files,omitempty"`
}

// reuseDBInfo carries what the box knew of a database, so the next checkpoint after a
// reused wake still finds changed pages without reading the whole file.
type reuseDBInfo struct {
	Path       string     `json:"path"`
	Hashes     []byte     `json:"hashes"` // little-endian uint64 per page
	DeltaPages [][]uint32 `json:"delta_pages,omitempty"`
}

// Reused reports whether the last Restore kept the local data dir (no download).
func (s *Syncer) Reused() bool { return s.reused }

func (s *Syncer) reusePath() string { return filepath.Join(s.WorkDir, reuseFile) }

// dropReuse removes the record: the data dir or the manifest is about to change.
func (s *Syncer) dropReuse() error {
	if s.WorkDir == "" {
		return nil
	}
	err := os.Remove(s.reusePath())
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return fmt.Errorf("removing reuse record: %v", err)
}

// filesHash identifies a manifest's file list.
func filesHash(files []File) (string, error) {
	b, err := json.Marshal(files)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// recordReuse writes the record after a final checkpoint, when the data dir provably equals
// s.manifest; otherwise it writes nothing and says why (the next wake restores in full).
func (s *Syncer) recordReuse() error {
	m := s.manifest
	if m == nil || s.FullFile || s.etag == "" || s.WorkDir == "" {
		return errors.New("no format-2 manifest")
	}
	byPath := make(map[string]File, len(m.Files))
	for _, f := range m.Files {
		if f.Content == nil {
			return fmt.Errorf("%s is a format-1 entry", f.Path)
		}
		byPath[f.Path] = f
	}
	// The checkpoint's fingerprints, by path: the content it recorded for each.
	read := make(map[string]File, len(s.hashes))
	fps := make(map[string]string, len(s.hashes))
	for fp, f := range s.hashes {
		fps[f.Path] = fp
		read[f.Path] = f
	}
	boot, err := bootID()
	if err != nil {
		return err
	}
	// The signature comes first and the checks after: a change between the two leaves a
	// record that no longer matches (a full restore), never one that vouches for content
	// nobody checked.
	names, err := signature(s.DataDir, byPath)
	if err != nil {
		return err
	}
	rec := reuseRecord{Host: s.Host, BootID: boot, DataDir: s.DataDir, Generation: m.Generation, ETag: s.etag, Names: names}
	if rec.FilesHash, err = filesHash(m.Files); err != nil {
		return err
	}
	rec.Files = m.Files
	for _, f := range m.Files {
		fp, err := fingerprint(s.DataDir, f.Path)
		if err != nil {
			return err
		}
		if !sameFiles([]File{read[f.Path]}, []File{f}) {
			return fmt.Errorf("%s: the checkpoint read other content", f.Path)
		}
		if fps[f.Path] != fp && f.Content.DB == nil {
			return fmt.Errorf("%s changed since the checkpoint read it", f.Path)
		}
		if f.Content.DB == nil {
			continue
		}
		st := s.dbs[f.Path]
		img := f.Content.DB
		if st == nil || st.v1 != nil || len(st.hashes) != int(img.Pages) || len(st.deltaPages) != len(img.Deltas) {
			return fmt.Errorf("%s: no page state", f.Path)
		}
		if strconv.FormatUint(xorAll(st.hashes), 16) != img.Checksum {
			return fmt.Errorf("%s: page state does not match the image", f.Path)
		}
		if fps[f.Path] != fp {
			// The checkpoint's own connection moved a WAL the instance left (killed before
			// it closed the database) into the file on closing: the bytes are the pages
			// the checkpoint read, unless something else wrote. Compare every page.
			if err := samePages(filepath.Join(s.DataDir, filepath.FromSlash(f.Path)), img, st.hashes); err != nil {
				return fmt.Errorf("%s: %v", f.Path, err)
			}
			if again, err := fingerprint(s.DataDir, f.Path); err != nil || again != fp {
				return fmt.Errorf("%s changed while it was compared", f.Path)
			}
		}
		hb := make([]byte, 8*len(st.hashes))
		for i, h := range st.hashes {
			binary.LittleEndian.PutUint64(hb[8*i:], h)
		}
		rec.DBs = append(rec.DBs, reuseDBInfo{Path: f.Path, Hashes: hb, DeltaPages: st.deltaPages})
	}
	body, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.WorkDir, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(s.WorkDir, reuseFile+"."+randHex(6))
	if err := os.WriteFile(tmp, body, 0o600); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, s.reusePath()); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// samePages reports (nil) whether the database file at p holds exactly the image's pages:
// its size is the image's and each page hashes to what the checkpoint recorded. The file is
// opened without following a link or blocking on a FIFO, and must be the file Lstat saw.
func samePages(p string, img *DBImage, hashes []uint64) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() != int64(img.Pages)*int64(img.PageSize) {
		return errors.New("not the image's size")
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi2, err := f.Stat(); err != nil || !os.SameFile(fi, fi2) {
		return errors.New("replaced while opening")
	}
	bp := fetchBufs.Get().(*[]byte)
	defer fetchBufs.Put(bp)
	buf := (*bp)[:fetchBuffer-fetchBuffer%img.PageSize]
	pg := uint32(1)
	for off := int64(0); off < fi.Size(); {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), fi.Size()-off)], off)
		if err != nil && !(errors.Is(err, io.EOF) && int64(n) == fi.Size()-off) {
			return err
		}
		for i := 0; i+img.PageSize <= n; i += img.PageSize {
			if pageHash(pg, buf[i:i+img.PageSize]) != hashes[pg-1] {
				return fmt.Errorf("page %d differs from the image", pg)
			}
			pg++
		}
		off += int64(n)
	}
	return nil
}

// bootID names the running kernel's boot. A record from an earlier boot is not trusted: a
// crash of the machine can keep a file's new size and times (journaled metadata) without
// the data written over its old blocks, which nobody had synced.
func bootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("reading the boot id: %v", err)
	}
	id := string(bytes.TrimSpace(b))
	if id == "" {
		return "", errors.New("empty boot id")
	}
	return id, nil
}

func xorAll(hs []uint64) uint64 {
	var x uint64
	for _, h := range hs {
		x ^= h
	}
	return x
}

// signature lists every name under dataDir as a line of its Lstat fields, sorted, refusing a
// tree that is not exactly files (regular, one link, permission bits only, the manifest's
// size and mode) and the directories that hold them.
func signature(dataDir string, files map[string]File) ([]string, error) {
	dirs := make(map[string]bool)
	for p := range files {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var names []string
	seen := 0
	err := filepath.WalkDir(dataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dataDir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st == nil {
			return fmt.Errorf("no stat for %s", rel)
		}
		switch {
		case fi.Mode().IsDir():
			if rel != "." && !dirs[rel] {
				return fmt.Errorf("%s is a directory the manifest has no file in", rel)
			}
		case fi.Mode().IsRegular():
			f, ok := files[rel]
			if !ok {
				return fmt.Errorf("%s is not in the manifest", rel)
			}
			if fi.Mode() != fs.FileMode(f.Mode&0o777) || fi.Size() != f.Size || st.Nlink != 1 {
				return fmt.Errorf("%s differs from the manifest", rel)
			}
			seen++
		default:
			return fmt.Errorf("%s is not a regular file", rel)
		}
		names = append(names, fmt.Sprintf("%q %d:%d %d %d %d.%d %o %d %d:%d", rel, st.Dev, st.Ino, fi.Size(),
			fi.ModTime().UnixNano(), st.Ctim.Sec, st.Ctim.Nsec, uint32(fi.Mode()), st.Nlink, st.Uid, st.Gid))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if seen != len(files) {
		return nil, errors.New("files of the manifest are missing")
	}
	sort.Strings(names)
	return names, nil
}

// reuse keeps the data dir when the record (taken and removed first) names the loaded
// manifest and the data dir is unchanged since; it seeds the caches as Restore does.
func (s *Syncer) reuse() bool {
	if s.WorkDir == "" {
		return false
	}
	body, err := os.ReadFile(s.reusePath())
	if err != nil {
		return false
	}
	if s.dropReuse() != nil {
		return false
	}
	var rec reuseRecord
	m := s.manifest
	boot, err := bootID()
	if err != nil || json.Unmarshal(body, &rec) != nil || rec.BootID != boot || m == nil || s.FullFile ||
		rec.Host != s.Host || rec.DataDir != s.DataDir || rec.Generation != m.Generation || rec.ETag == "" || rec.ETag != s.etag {
		return false
	}
	if fh, err := filesHash(m.Files); err != nil || fh != rec.FilesHash {
		return false
	}
	byPath := make(map[string]File, len(m.Files))
	for _, f := range m.Files {
		if f.Content == nil {
			return false
		}
		byPath[f.Path] = f
	}
	names, err := signature(s.DataDir, byPath)
	if err != nil || len(names) != len(rec.Names) {
		return false
	}
	for i := range names {
		if names[i] != rec.Names[i] {
			return false
		}
	}
	info := make(map[string]reuseDBInfo, len(rec.DBs))
	for _, d := range rec.DBs {
		info[d.Path] = d
	}
	hashes := make(map[string]File, len(m.Files))
	dbs := make(map[string]*dbState)
	for _, f := range m.Files {
		fp, err := fingerprint(s.DataDir, f.Path)
		if err != nil {
			return false
		}
		hashes[fp] = f
		img := f.Content.DB
		if img == nil {
			continue
		}
		d, ok := info[f.Path]
		if !ok || len(d.Hashes) != 8*int(img.Pages) || len(d.DeltaPages) != len(img.Deltas) {
			return false
		}
		st := &dbState{img: img, hashes: make([]uint64, img.Pages), deltaPages: d.DeltaPages}
		for i := range st.hashes {
			st.hashes[i] = binary.LittleEndian.Uint64(d.Hashes[8*i:])
		}
		st.sum = xorAll(st.hashes)
		if strconv.FormatUint(st.sum, 16) != img.Checksum {
			return false
		}
		fi, err := os.Lstat(filepath.Join(s.DataDir, filepath.FromSlash(f.Path)))
		if err != nil {
			return false
		}
		st.dev, st.ino = statID(fi)
		dbs[f.Path] = st
	}
	s.hashes, s.readAt, s.dbs = hashes, nil, dbs
	return true
}

// racyMargin covers the coarseness of file timestamps: the kernel stamps ctime from a clock
// that may lag the wall clock by a tick.
const racyMargin = 50 * time.Millisecond

// racy reports whether the file rel (or a SQLite sidecar of it) changed so close to the time
// its cached content was read (at, while the instance ran) that a write just after the
// fingerprint was taken may have left the fingerprint unchanged, as git's "racily clean"
// index entries. A final checkpoint reads such a file again rather than trust the cache, so
// the record it leaves for the next wake never vouches for content it did not see.
func (s *Syncer) racy(rel string, at time.Time) bool {
	if at.IsZero() {
		return false
	}
	for i, suf := range append([]string{""}, sidecarSuffixes...) {
		fi, err := os.Lstat(filepath.Join(s.DataDir, filepath.FromSlash(rel+suf)))
		if err != nil {
			if i > 0 && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return true
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st == nil || !time.Unix(st.Ctim.Sec, st.Ctim.Nsec).Before(at.Add(-racyMargin)) {
			return true
		}
	}
	return false
}

// KeepRestored records the data dir, as the last Restore left it and nothing has run on it
// since, for reuse: a wake that restored and then could not go on (the lease held
// elsewhere) leaves what it downloaded, or the standby copy it found (Warm), for the next
// wake here instead of losing it. The record's checks are Warm's.
func (s *Syncer) KeepRestored() error { return s.recordReuse() }
