package spacestore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// A standby box keeps a space warm (engine.Prewarm): it restores each new checkpoint of the
// space into the space's data dir and records it for reuse, so that a takeover there
// downloads nothing. A space checkpoints at its replication interval, so a busy one's
// standby would download it whole every interval; Warm instead restores a new checkpoint
// over the one the data dir holds (its reuse record names it) by what changed: a database
// whose base is the same gets the new checkpoint's deltas only (small: the pages changed
// since the base), a file that did not change is kept, and only the rest is downloaded.
// Each database is then checked against the manifest's page checksum, as a full restore
// checks it; any doubt is a full restore.

// Warm restores the loaded manifest into DataDir (over the checkpoint a reuse record says
// it holds, by what changed, or in full as Restore does) and records it for reuse, so that
// the next Restore of the same manifest on this box downloads nothing. The space must not
// run here: Warm writes its data dir. fetched is the bytes of objects downloaded.
func (s *Syncer) Warm(ctx context.Context) (fetched int64, err error) {
	if s.manifest == nil {
		return 0, errors.New("warming: no manifest loaded")
	}
	fetched, done, err := s.warmOver(ctx)
	if err != nil {
		// The data dir may be half-written and has no record: restore it in full.
		done = false
	}
	if !done {
		if err := s.Restore(ctx); err != nil {
			return 0, err
		}
		if !s.reused {
			fetched = manifestBytes(s.manifest)
		}
	}
	if err := s.recordReuse(); err != nil {
		return fetched, fmt.Errorf("warming: the restored data dir cannot be reused: %w", err)
	}
	return fetched, nil
}

// manifestBytes is the size of the objects a full restore of m downloads.
func manifestBytes(m *Manifest) int64 {
	var n int64
	for _, f := range m.Files {
		for _, r := range f.refs() {
			n += r.Size
		}
	}
	return n
}

// warmOver restores the loaded manifest over the data dir by what changed since the
// checkpoint the reuse record names. done false (err nil): it did not apply (no usable
// record, the same manifest, or nothing to save), and nothing was changed. An error comes
// after the record was taken: the data dir must be restored in full.
func (s *Syncer) warmOver(ctx context.Context) (fetched int64, done bool, err error) {
	if s.WorkDir == "" || s.FullFile {
		return 0, false, nil
	}
	body, err := os.ReadFile(s.reusePath())
	if err != nil {
		return 0, false, nil
	}
	var rec reuseRecord
	boot, err := bootID()
	if err != nil || json.Unmarshal(body, &rec) != nil || rec.BootID != boot || rec.Host != s.Host ||
		rec.DataDir != s.DataDir || rec.ETag == s.etag || len(rec.Files) == 0 {
		return 0, false, nil // nothing to go on, or Restore keeps it as it is
	}
	if fh, err := filesHash(rec.Files); err != nil || fh != rec.FilesHash {
		return 0, false, nil
	}
	old := make(map[string]File, len(rec.Files))
	for _, f := range rec.Files {
		if f.Content == nil {
			return 0, false, nil
		}
		old[f.Path] = f
	}
	names, err := signature(s.DataDir, old)
	if err != nil || !slices.Equal(names, rec.Names) {
		return 0, false, nil
	}
	oldDBs := make(map[string]reuseDBInfo, len(rec.DBs))
	for _, d := range rec.DBs {
		oldDBs[d.Path] = d
	}
	files := s.manifest.Files
	for _, f := range files {
		if f.Content == nil || !fs.ValidPath(f.Path) || f.Path == "." {
			return 0, false, nil // a format-1 entry or a bad path: Restore says why
		}
	}
	if err := s.dropReuse(); err != nil {
		return 0, false, err
	}

	// From here the data dir is being changed: an error means a full restore.
	keep := make(map[string]bool, len(files))
	for _, f := range files {
		keep[f.Path] = true
	}
	for p := range old {
		if !keep[p] {
			if err := removeFile(s.DataDir, p); err != nil {
				return 0, true, err
			}
		}
	}
	dbs := make(map[string]*dbState)
	var whole []File
	for _, f := range files {
		o, had := old[f.Path]
		switch {
		case had && sameFiles([]File{o}, []File{f}):
			if img := f.Content.DB; img != nil {
				st, err := oldDBState(oldDBs[f.Path], img)
				if err != nil {
					return 0, true, fmt.Errorf("%s: %w", f.Path, err)
				}
				dbs[f.Path] = st
			}
		case had && sameBase(o, f):
			st, n, err := s.applyNewDeltas(ctx, o, f, oldDBs[f.Path])
			if err != nil {
				return 0, true, fmt.Errorf("%s: %w", f.Path, err)
			}
			fetched += n
			dbs[f.Path] = st
		default:
			if had {
				if err := removeFile(s.DataDir, f.Path); err != nil {
					return 0, true, err
				}
			}
			whole = append(whole, f)
		}
	}
	if len(whole) > 0 {
		got, err := restoreFiles(ctx, s, s.DataDir, whole)
		if err != nil {
			return 0, true, err
		}
		for _, f := range whole {
			fetched += manifestBytes(&Manifest{Files: []File{f}})
			if st := got[f.Path]; st != nil {
				dbs[f.Path] = st
			}
		}
	}
	s.seedCaches(files, dbs)
	s.reused = false
	return fetched, true, nil
}

// sameBase reports whether the databases o and f share their base (the same page size,
// chunking and base objects): f is o's base plus f's deltas, which cover every page o's
// deltas changed.
func sameBase(o, f File) bool {
	a, b := o.Content.DB, f.Content.DB
	return a != nil && b != nil && a.PageSize == b.PageSize && a.ChunkBytes == b.ChunkBytes &&
		slices.Equal(a.Base, b.Base) && o.Mode == f.Mode
}

// oldDBState is the page state of a database the record vouches for, unchanged.
func oldDBState(d reuseDBInfo, img *DBImage) (*dbState, error) {
	if len(d.Hashes) != 8*int(img.Pages) || len(d.DeltaPages) != len(img.Deltas) {
		return nil, errors.New("the reuse record has no page state for it")
	}
	st := &dbState{img: img, hashes: make([]uint64, img.Pages), deltaPages: d.DeltaPages}
	for i := range st.hashes {
		st.hashes[i] = binary.LittleEndian.Uint64(d.Hashes[8*i:])
	}
	st.sum = xorAll(st.hashes)
	if strconv.FormatUint(st.sum, 16) != img.Checksum {
		return nil, errors.New("its page state does not match the image")
	}
	return st, nil
}

// applyNewDeltas brings the database f.Path, which holds the record's checkpoint of it (o,
// its page state d), to f: f's deltas downloaded and applied in order over it (a page they
// carry at its value as of f; a page they do not carry is the base's, as in the file),
// but for the run of them o already had (the same objects, first to last), the file cut
// to f's size, and the result checked against f's page checksum.
func (s *Syncer) applyNewDeltas(ctx context.Context, o, f File, d reuseDBInfo) (*dbState, int64, error) {
	img := f.Content.DB
	hashes := make([]uint64, img.Pages)
	for i := range min(len(hashes), len(d.Hashes)/8) {
		hashes[i] = binary.LittleEndian.Uint64(d.Hashes[8*i:])
	}
	had := o.Content.DB.Deltas
	kept := 0
	for kept < len(had) && kept < len(img.Deltas) && kept < len(d.DeltaPages) && had[kept].Ref == img.Deltas[kept].Ref {
		kept++
	}
	var jobs []*fetch
	var fetched int64
	for _, dr := range img.Deltas[kept:] {
		jobs = append(jobs, &fetch{ref: dr.Ref, checked: true})
		fetched += dr.Size
	}
	if err := fetchAll(ctx, s, jobs); err != nil {
		return nil, 0, err
	}
	p := filepath.Join(s.DataDir, filepath.FromSlash(f.Path))
	out, err := os.OpenFile(p, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, err
	}
	defer out.Close()
	pages := slices.Clone(d.DeltaPages[:kept])
	for _, j := range jobs {
		ps, err := applyDelta(out, j.mem, img, hashes)
		if err != nil {
			return nil, 0, err
		}
		pages = append(pages, ps)
	}
	if err := out.Truncate(f.Size); err != nil {
		return nil, 0, err
	}
	st := &dbState{img: img, hashes: hashes, deltaPages: pages, sum: xorAll(hashes)}
	if strconv.FormatUint(st.sum, 16) != img.Checksum {
		return nil, 0, fmt.Errorf("database fails its checksum after its new deltas: %x, manifest says %s", st.sum, img.Checksum)
	}
	return st, fetched, out.Close()
}

// removeFile removes rel from root, and the directories it leaves empty.
func removeFile(root, rel string) error {
	if err := os.Remove(filepath.Join(root, filepath.FromSlash(rel))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		if err := os.Remove(filepath.Join(root, filepath.FromSlash(d))); err != nil {
			break // not empty (or gone): its parents are not empty either
		}
	}
	return nil
}
