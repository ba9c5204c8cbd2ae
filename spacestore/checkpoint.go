package spacestore

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"sort"
	"time"
)

// Mode is the kind of a checkpoint, chosen per call: what it does beyond uploading what
// changed.
type Mode int

const (
	// Periodic is a checkpoint of a running (or stopped) instance that uploads what changed
	// and keeps each database's delta chain as the chain policy leaves it.
	Periodic Mode = iota
	// Final is the checkpoint taken once the instance has stopped, before the space sleeps:
	// it folds each database's delta chain (into the base when that rewrites at most
	// foldBaseBytes, else into one delta), so the next wake reads the base and at most one
	// delta; it reads again every file a write may have slipped past (racy), and records
	// the data dir for the next wake on this box to keep (reuse.go).
	Final
	// Fold is a background fold (see Fold): databases whose chain is longer than FoldChain
	// have their newest deltas merged.
	Fold
)

// String returns the mode's name, as logs and test failures show it.
func (m Mode) String() string {
	switch m {
	case Periodic:
		return "periodic"
	case Final:
		return "final"
	case Fold:
		return "fold"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// refolds reports whether a checkpoint in mode m rewrites a database's image even when none
// of its pages changed: a final checkpoint folds any chain worth folding, a background fold
// only a long one.
func (m Mode) refolds(st *dbState) bool {
	switch m {
	case Final:
		return st.foldable()
	case Fold:
		return st.chainLong()
	}
	return false
}

// Checkpoint snapshots DataDir, uploads what changed and writes a new manifest conditioned on
// the last ETag this box saw; mode says what else it does (see Mode). Nothing is written when
// neither the files nor nextWake changed. ErrFenced means another writer owns the space: do
// not retry.
//
// In format 2 a SQLite database costs what changed in it: its changed pages go up as one LTX
// delta (see checkpointDB); a plain file is split into content-defined chunks and only new
// chunks go up. Once the manifest is written its copy goes to history/, and every
// gcInterval generations unreferenced objects are collected.
//
// Every checkpoint first removes the record a wake on this box may reuse the data dir by
// (reuse.go); a successful Final checkpoint writes it again when the data dir provably
// equals the manifest.
func (s *Syncer) Checkpoint(ctx context.Context, mode Mode, nextWake *time.Time, now time.Time) (Stats, error) {
	if mode < Periodic || mode > Fold {
		return Stats{}, fmt.Errorf("checkpointing: unknown mode %v", mode)
	}
	if err := s.dropReuse(); err != nil {
		return Stats{}, err
	}
	st, err := s.checkpoint(ctx, mode, nextWake, now)
	if err == nil && mode == Final && !s.FullFile {
		st.ReuseErr = s.recordReuse()
	}
	return st, err
}

func (s *Syncer) checkpoint(ctx context.Context, mode Mode, nextWake *time.Time, now time.Time) (Stats, error) {
	if s.FullFile {
		return s.checkpointV1(ctx, nextWake, now)
	}
	start := time.Now()
	var st Stats
	if s.hashes == nil {
		s.hashes = make(map[string]File)
	}
	if s.dbs == nil {
		s.dbs = make(map[string]*dbState)
	}
	gen := int64(1)
	if s.manifest != nil {
		gen = s.manifest.Generation + 1
	}
	up := newUploader(s.Bucket, s.Host, s.manifest)
	files, fresh, readAt, dbs, err := s.walk(ctx, mode, gen, now, up, &st)
	if werr := up.wait(); err == nil {
		err = werr
	}
	st.BlobsUploaded, st.BytesUploaded = up.objects, up.bytes
	if err != nil {
		return st, err
	}
	st.Files = len(files)
	if s.manifest != nil && sameFiles(s.manifest.Files, files) && sameTime(s.manifest.NextWake, nextWake) {
		s.hashes, s.readAt, s.dbs = fresh, readAt, dbs // same content; newer WAL positions and fingerprints
		st.Duration = time.Since(start)
		return st, nil
	}
	m := &Manifest{Format: Format, Generation: gen, Files: files, WrittenBy: s.WrittenBy, WrittenAt: now.UTC(), NextWake: nextWake, Claim: s.claim}
	etag, err := s.writeManifest(ctx, m)
	if err != nil {
		return st, err
	}
	s.manifest, s.etag, s.hashes, s.readAt, s.dbs = m, etag, fresh, readAt, dbs
	st.ManifestWritten = true
	// History follows the swap, never precedes it: a fenced writer's entry would otherwise
	// take the generation's name from the real one. A lost entry only narrows what can be
	// restored; the checkpoint itself stands.
	if err := WriteHistory(ctx, s.Bucket, s.Host, m); err != nil {
		st.HistoryErr = err
		st.Duration = time.Since(start)
		return st, nil
	}
	if gen-s.gcAt >= gcInterval && gen%gcInterval == 0 {
		s.gcAt = gen
		if s.histCache == nil {
			s.histCache = make(map[string][]Ref)
		}
		gs, err := Collect(ctx, s.Bucket, s.Host, s.retention(), s.gcGrace(), s.histCache)
		st.GC, st.GCErr = &gs, err
	}
	st.Duration = time.Since(start)
	return st, nil
}

func (s *Syncer) retention() time.Duration {
	if s.Retention > 0 {
		return s.Retention
	}
	return DefaultRetention
}

func (s *Syncer) gcGrace() time.Duration {
	if s.GCGrace > 0 {
		return s.GCGrace
	}
	return DefaultGCGrace
}

// walk visits DataDir and returns its files (sorted by path), the fingerprint cache (and when
// each entry was read) and the database states to keep if the manifest is written.
// Unchanged files (same fingerprint) are not read, except databases whose chain mode folds
// and, in a final checkpoint, files a write could have slipped past unnoticed (racy). SQLite
// -wal, -shm and -journal files are part of their database, never files of their own.
// Symlinks, FIFOs, sockets and devices are skipped and listed in st.Skipped.
func (s *Syncer) walk(ctx context.Context, mode Mode, gen int64, now time.Time, up *uploader, st *Stats) ([]File, map[string]File, map[string]time.Time, map[string]*dbState, error) {
	var files []File
	fresh := make(map[string]File)
	readAt := make(map[string]time.Time)
	dbs := make(map[string]*dbState)
	err := walkFiles(ctx, s.DataDir, &st.Skipped, func(p, rel string, info fs.FileInfo, fp string) error {
		perm := uint32(info.Mode().Perm())
		if f, ok := s.hashes[fp]; ok && !mode.refolds(s.dbs[rel]) && !(mode == Final && s.racy(rel, s.readAt[fp])) {
			f.Path, f.Mode = rel, perm
			files = append(files, f)
			fresh[fp] = f
			if at, ok := s.readAt[fp]; ok {
				readAt[fp] = at
			}
			if db := s.dbs[rel]; db != nil {
				dbs[rel] = db
			}
			return nil
		}
		if mode != Final {
			// The instance may write while this checkpoint reads (a final checkpoint runs
			// after it stopped, so what that one reads is final).
			readAt[fp] = time.Now()
		}
		isDB, err := isSQLite(p)
		if err != nil {
			if gone(p) {
				return nil
			}
			return err
		}
		var f File
		if isDB {
			res, err := s.checkpointDB(ctx, p, gen, s.dbs[rel], mode, now, up)
			if err != nil {
				if ctx.Err() == nil && gone(p) {
					return nil
				}
				return fmt.Errorf("checkpointing %s: %w", rel, err)
			}
			f = res.file
			dbs[rel] = res.state
			st.PagesChanged += res.pagesChanged
			if res.fullScan {
				st.FullScans++
			}
		} else {
			if f, err = s.chunkFile(ctx, p, gen, up); err != nil {
				if ctx.Err() == nil && gone(p) {
					return nil
				}
				return fmt.Errorf("checkpointing %s: %w", rel, err)
			}
		}
		f.Path, f.Mode = rel, perm
		files = append(files, f)
		fresh[fp] = f
		return nil
	})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, fresh, readAt, dbs, nil
}

// sameFiles reports whether two file lists describe the same content.
func sameFiles(a, b []File) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// FoldDue reports whether a database's delta chain is longer than FoldChain: a wake after a
// crash would read more deltas than that until Fold runs.
func (s *Syncer) FoldDue() bool {
	for _, st := range s.dbs {
		if st.chainLong() {
			return true
		}
	}
	return false
}

// Fold merges the newest deltas of each database whose chain is longer than FoldChain (see
// foldFrom) and writes the result as a checkpoint: under the caller's lease, conditioned on
// the manifest's ETag like any checkpoint, keeping its next wake. It reads the live
// databases, so changes since the last checkpoint go up with it. After a periodic
// checkpoint that leaves FoldDue true the engine does the same (a checkpoint in mode Fold,
// through its own checkpoint call, which freezes an isolated instance and handles fencing),
// so a wake after a crash reads at most FoldChain deltas per database.
func (s *Syncer) Fold(ctx context.Context, now time.Time) (Stats, error) {
	if s.FullFile || s.manifest == nil || !s.FoldDue() {
		return Stats{}, nil
	}
	return s.Checkpoint(ctx, Fold, s.manifest.NextWake, now)
}
