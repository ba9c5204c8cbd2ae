package spacestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

// ErrSegmentTooLarge means the commits since the last segment changed more pages than one
// segment holds (maxSegmentBytes): they cannot be logged, so the caller checkpoints
// instead and starts a new shipper from the checkpoint (the answers wait for it).
var ErrSegmentTooLarge = errors.New("changes too large for one log segment")

// LogBase is the state of a space's databases that a LogShipper ships changes against: per
// database (by path relative to the data dir), the file's identity, its page size and count,
// a hash of each page and how far its WAL was read. It comes from the Syncer after a
// Restore or a checkpoint (Syncer.LogBase) and follows the segments applied after a
// restore (Syncer.ApplySegments); a database it does not know is shipped whole.
type LogBase struct {
	dbs map[string]*dbState
}

// LogBase returns the state of the databases as this Syncer last restored or checkpointed
// them: the base of a LogShipper for the log of the manifest's generation. Like every
// Syncer method it runs under the space's operation lock; the base is a copy, the Syncer's
// later checkpoints do not change it.
func (s *Syncer) LogBase() *LogBase {
	b := &LogBase{dbs: make(map[string]*dbState, len(s.dbs))}
	for rel, st := range s.dbs {
		if st == nil || st.img == nil {
			continue
		}
		b.dbs[rel] = &dbState{dev: st.dev, ino: st.ino, img: &DBImage{PageSize: st.img.PageSize, Pages: st.img.Pages},
			hashes: slices.Clone(st.hashes), sum: st.sum, wal: st.wal}
	}
	return b
}

// ApplySegments writes segs, in order, into the databases of the data dir this Syncer has
// just restored: each segment's page images at their offsets, each file's size set from
// its page count, a database the manifest lacks created. Every segment's LTX files are
// checked whole (DecodeSegment's checks, their checksums among them) before anything is
// written. A database restored from the manifest plus its log then opens in SQLite with
// every committed row. base (nil: none) is brought in step, so the shipper that follows
// does not ship the applied pages again.
//
// The Syncer forgets what it cached of the files written, so its next checkpoint reads
// them (a write within a timestamp tick of the restore could leave their fingerprints as
// they were); its image of each database stays the manifest's, which that checkpoint's
// delta builds on. Call it before the instance starts: a database whose WAL is not empty
// is refused, since SQLite would replay that WAL over the pages.
func (s *Syncer) ApplySegments(base *LogBase, segs []*Segment) error {
	written, err := applySegments(s.DataDir, segs, base)
	for fp, f := range s.hashes {
		if written[f.Path] {
			delete(s.hashes, fp)
			delete(s.readAt, fp)
		}
	}
	return err
}

// applySegments is ApplySegments on the data dir dataDir; it returns the paths it wrote.
func applySegments(dataDir string, segs []*Segment, base *LogBase) (map[string]bool, error) {
	for _, seg := range segs {
		if err := seg.check(); err != nil {
			return nil, fmt.Errorf("applying log segment %d: %w", seg.Seq, err)
		}
		for _, d := range seg.DBs {
			if err := checkLTX(d, nil); err != nil {
				return nil, fmt.Errorf("applying log segment %d: %s: %w", seg.Seq, d.Path, err)
			}
		}
	}
	if base == nil {
		base = &LogBase{}
	}
	if base.dbs == nil {
		base.dbs = make(map[string]*dbState)
	}
	written := make(map[string]bool)
	for _, seg := range segs {
		for _, d := range seg.DBs {
			written[d.Path] = true
			if err := applyDB(dataDir, d, base); err != nil {
				return written, fmt.Errorf("applying log segment %d: %s: %w", seg.Seq, d.Path, err)
			}
		}
	}
	return written, nil
}

// applyDB writes one database's pages into its file and updates its state in base.
func applyDB(dataDir string, d SegmentDB, base *LogBase) error {
	abs := filepath.Join(dataDir, filepath.FromSlash(d.Path))
	if fi, err := os.Lstat(abs + "-wal"); err == nil && fi.Size() > 0 {
		return errors.New("the database has a WAL, which SQLite would replay over the log's pages")
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%v)", fi.Mode().Type())
	}
	dev, ino := statID(fi)
	st := base.dbs[d.Path]
	if st == nil || st.dev != dev || st.ino != ino || st.img.PageSize != d.PageSize {
		// Pages the state does not know hash to 0: the next full compare ships them.
		st = &dbState{dev: dev, ino: ino}
	}
	if n := int(d.Pages); n <= len(st.hashes) {
		st.hashes = st.hashes[:n]
	} else {
		st.hashes = append(st.hashes, make([]uint64, n-len(st.hashes))...)
	}
	err = checkLTX(d, func(pg uint32, data []byte) error {
		if _, err := f.WriteAt(data, int64(pg-1)*int64(d.PageSize)); err != nil {
			return err
		}
		st.hashes[pg-1] = pageHash(pg, data)
		return nil
	})
	if err != nil {
		return err
	}
	if err := f.Truncate(int64(d.Pages) * int64(d.PageSize)); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	st.img = &DBImage{PageSize: d.PageSize, Pages: d.Pages}
	st.wal, st.sum = pageread.WALPos{}, 0
	for _, h := range st.hashes {
		st.sum ^= h
	}
	base.dbs[d.Path] = st
	return nil
}

// LogShipper follows a space's SQLite databases and builds the log's segments: each Next
// returns the pages committed since the last segment (or since the base), per database, as
// the next segment of the log of its generation. It reads the pages exactly as a checkpoint
// does (detectChanges): the WAL's tail while the WAL keeps its salts, one full compare of
// every page against the known hashes when SQLite restarted the WAL or moved its frames into
// the database, through the page reader a checkpoint uses (lchat-pageread under the space's
// uid, or in process).
//
// Only databases in WAL mode are shipped. A database in rollback-journal mode (its commits
// leave no WAL to follow) and every other file are covered by checkpoints only, as are a
// database's removal and rename (the new name is shipped whole); Skipped names what the last
// Next left out, so the engine can log and report it.
//
// A LogShipper is used by one goroutine at a time, which ships and checkpoints in turn:
// after a checkpoint swaps the manifest, the log of the new generation starts with a new
// LogShipper on the Syncer's LogBase, at seq 1.
//
// Between segments it keeps, per database, the SQLite connection that takes the write lock
// (pageread.Keeper; for an isolated space one lchat-pageread process that keeps them,
// HelperViews), so a segment costs a BEGIN IMMEDIATE per changed database rather than a
// new connection or a new process. What a kept connection means for the instance is in
// pageread.Keeper's doc; one not used for keepIdle is closed, so a space whose writes
// paused holds none. Close closes them: the owner calls it when it is done with the
// shipper.
type LogShipper struct {
	dataDir string
	reader  *PageReader
	// keep opens the views and keeps their connections (nil: each view opens its own).
	keep viewKeeper
	// viewed holds, by absolute path, when each database with a kept connection was last
	// read (the caller's clock).
	viewed map[string]time.Time
	gen    int64
	next   int64
	claim  Claim
	// dbs holds, by path, the state of each database as the last segment (or the base) left it.
	dbs map[string]*dbState
	// seen holds, by path, the stat signature of a database and its WAL when last read:
	// unchanged and older than racyMargin, nothing was committed since.
	seen map[string]dbSig
	// kinds caches what each file of the data dir is, by its stat signature.
	kinds map[string]kindSig
	// walked is the last walk of the data dir, reused while its directories keep their
	// signatures (nil: walk again).
	walked  *walked
	skipped []SkippedFile
	// opens counts the views opened: what "nothing new" saves; walks the walks that read
	// the data dir's directories: what an unchanged directory saves.
	opens, walks int
	// fullScans counts the reads that compared every page of a database (its WAL
	// restarted in a way a tail cannot follow, or another file): what a tail saves.
	fullScans int
	// holdLimit is maxHeldBytes (a test lowers it).
	holdLimit int
	// spare is the page hashes of a state the last Next replaced, one its own reads made
	// (dbState.shipped: not a base's, which others may hold): the next read's new state
	// takes the memory rather than a copy of its own.
	spare []uint64
}

// NewLogShipper returns a shipper of the log of generation gen, whose next segment is seq
// next (1 for a new log, the seq SealLog returned after a takeover), written under claim,
// that reads the databases of dataDir through reader (nil: in this process, for a space
// that runs as the box's own user) and ships what changed since base (nil: nothing known,
// every database shipped whole). The shipper owns base from then on.
func NewLogShipper(dataDir string, reader *PageReader, base *LogBase, gen, next int64, claim Claim) *LogShipper {
	l := &LogShipper{dataDir: dataDir, reader: reader, gen: gen, next: next, claim: claim,
		dbs: make(map[string]*dbState), seen: make(map[string]dbSig), kinds: make(map[string]kindSig),
		viewed: make(map[string]time.Time), holdLimit: maxHeldBytes}
	if reader == nil {
		l.keep = inProcess{pageread.NewKeeper()}
	} else {
		l.keep = NewHelperViews(reader)
	}
	// Close is the owner's; a shipper dropped without it lets its connections (and its
	// helper) go when it is collected, off the collector's goroutine (a helper's end waits
	// for it to exit).
	runtime.AddCleanup(l, func(k viewKeeper) { go k.Close() }, l.keep)
	if base != nil {
		for rel, st := range base.dbs {
			l.dbs[rel] = st
		}
	}
	return l
}

// maxHeldBytes bounds the copies of changed pages a LogShipper keeps to encode a segment
// after letting the database's lock go (heldPages); a larger change is encoded under the
// lock, from the view.
const maxHeldBytes = 32 << 20

// keepIdle is how long a LogShipper keeps a database's connection after its last view: a
// space that writes keeps its connections, one whose writes paused holds none.
const keepIdle = 5 * time.Second

// viewKeeper opens views and keeps their connections: pageread.Keeper in this process,
// HelperViews in lchat-pageread.
type viewKeeper interface {
	Open(ctx context.Context, abs string, since *pageread.WALPos) (pageread.Source, error)
	Forget(abs string)
	Close() error
}

// inProcess is a pageread.Keeper as a viewKeeper.
type inProcess struct{ *pageread.Keeper }

func (k inProcess) Open(ctx context.Context, abs string, since *pageread.WALPos) (pageread.Source, error) {
	return k.Keeper.OpenTail(ctx, abs, since)
}

// Close closes the connections the shipper keeps (and the helper that keeps them). Next may
// still be called after it; its views then open connections of their own. It is
// idempotent and safe to call while Next runs.
func (l *LogShipper) Close() error {
	if l.keep == nil {
		return nil
	}
	return l.keep.Close()
}

// Gen is the generation of the log the shipper writes.
func (l *LogShipper) Gen() int64 { return l.gen }

// NextSeq is the seq of the shipper's next segment.
func (l *LogShipper) NextSeq() int64 { return l.next }

// Skipped names the files the last Next did not ship: "rollback-journal database", "file",
// "database too large for the log", or the kinds a checkpoint skips too (oddfiles.go).
func (l *LogShipper) Skipped() []SkippedFile { return l.skipped }

// Next returns the next segment: the pages committed since the last one, per database in WAL
// mode. It returns nil when nothing was committed since: cheaply, from a stat of each
// database and its WAL (inode, size, mtime), when neither changed since the last read and
// both had been written more than racyMargin before it, so a write within a timestamp tick
// cannot hide. now is the wall clock (it is
// compared with the files' timestamps, and stamps the LTX files).
//
// The returned segment extends the state the previous one left: land it (AppendSegment,
// again with the same segment after an error that may have been applied) before calling
// Next again. An error leaves the shipper as it was; ErrSegmentTooLarge calls for a
// checkpoint.
func (l *LogShipper) Next(ctx context.Context, now time.Time) (*Segment, error) {
	files, skipped, err := l.walk(ctx, now)
	if err != nil {
		return nil, fmt.Errorf("shipping log: %w", err)
	}
	type pending struct {
		st  *dbState
		sig dbSig
	}
	done := make(map[string]pending)
	vanished := make(map[string]bool)
	var dbs []SegmentDB
	total := 0
	for _, rel := range files {
		abs := filepath.Join(l.dataDir, filepath.FromSlash(rel))
		sig, err := statDBSig(abs, now)
		if errors.Is(err, fs.ErrNotExist) {
			vanished[rel] = true
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("shipping log: %w", err)
		}
		switch kind, err := l.kind(rel, abs, sig.main, now); {
		case errors.Is(err, fs.ErrNotExist):
			vanished[rel] = true
			continue
		case err != nil:
			return nil, fmt.Errorf("shipping log: %s: %w", rel, err)
		case kind != kindWALDB:
			skipped = append(skipped, SkippedFile{Path: rel, Kind: kind})
			continue
		}
		prev := l.dbs[rel]
		if seen, ok := l.seen[rel]; ok && prev != nil && seen.unchanged(sig) {
			continue
		}
		d, st, err := l.read(ctx, abs, rel, prev, now)
		if err != nil {
			if ctx.Err() == nil && gone(abs) {
				vanished[rel] = true
				continue
			}
			return nil, fmt.Errorf("shipping log: %s: %w", rel, err)
		}
		if st == nil {
			skipped = append(skipped, SkippedFile{Path: rel, Kind: "database too large for the log"})
			continue
		}
		done[rel] = pending{st: st, sig: sig}
		if d != nil {
			dbs = append(dbs, *d)
			total += len(d.LTX) + len(d.Path) + 16
			if total > maxSegmentBytes-4096 {
				return nil, fmt.Errorf("shipping log: %w", ErrSegmentTooLarge)
			}
		}
	}
	for rel, p := range done {
		if old := l.dbs[rel]; old != nil && old.shipped && cap(old.hashes) > cap(l.spare) {
			l.spare = old.hashes
		}
		l.dbs[rel], l.seen[rel] = p.st, p.sig
	}
	for rel := range vanished {
		delete(l.dbs, rel)
		delete(l.seen, rel)
		delete(l.kinds, rel)
		l.forget(filepath.Join(l.dataDir, filepath.FromSlash(rel)))
	}
	for abs, at := range l.viewed {
		if now.Sub(at) > keepIdle {
			l.forget(abs)
		}
	}
	l.skipped = skipped
	if len(dbs) == 0 {
		return nil, nil
	}
	seg := &Segment{Gen: l.gen, Seq: l.next, Claim: l.claim, DBs: dbs}
	l.next++
	return seg, nil
}

// read opens one database and returns what changed in it since prev, nil when nothing did,
// with its new state (nil: too large for the log).
func (l *LogShipper) read(ctx context.Context, abs, rel string, prev *dbState, now time.Time) (*SegmentDB, *dbState, error) {
	var since *pageread.WALPos
	if prev != nil && prev.wal.Frames > 0 {
		since = &prev.wal
	}
	l.opens++
	open := func(since *pageread.WALPos) (pageread.Source, error) {
		if l.keep != nil {
			l.viewed[abs] = now
			return l.keep.Open(ctx, abs, since)
		}
		return openSource(ctx, l.reader, abs, since)
	}
	v, err := open(since)
	if err != nil {
		return nil, nil, err
	}
	if sh := v.Shape(); sh.Tail && !prev.sameFile(sh) {
		// Another file under the same WAL: every page is compared, from a full view (a tail
		// view read without the lock would take it for IndexAll, and may move on meanwhile).
		v.Close()
		if v, err = open(nil); err != nil {
			return nil, nil, err
		}
	}
	defer func() { v.Close() }()
	if v.Shape().Pages > maxLogPages {
		return nil, nil, nil
	}
	hold := &heldPages{limit: l.holdLimit}
	defer hold.release() // encodePages has copied the pages by then
	spare := l.spare
	l.spare = nil // the new state's now, if it takes it
	ch, err := detectChanges(v, prev, hold, spare)
	if err != nil {
		return nil, nil, err
	}
	if ch.fullScan {
		l.fullScans++
	}
	st := ch.state
	st.img, st.shipped = &DBImage{PageSize: ch.pageSize, Pages: ch.pages}, true
	if ch.pages == 0 || ch.usable && len(ch.changed) == 0 && ch.pages == prev.img.Pages {
		return nil, st, nil
	}
	sh, read := v.Shape(), v.ReadPages
	if !hold.over {
		// Every changed page is held: the instance may commit again while we encode.
		v.Close()
		read = hold.ReadPages
	}
	// LTX transaction ids start at 2: an LTX file starting at 1 is a snapshot.
	data, err := encodePages(sh, read, ch.changed, l.next+1, l.next+1, now)
	if err != nil {
		return nil, nil, err
	}
	return &SegmentDB{Path: rel, PageSize: ch.pageSize, Pages: ch.pages, LTX: data}, st, nil
}

// forget closes the connection kept for the database at abs.
func (l *LogShipper) forget(abs string) {
	if _, ok := l.viewed[abs]; ok {
		delete(l.viewed, abs)
		l.keep.Forget(abs)
	}
}

// openSource opens one consistent view of the database at abs through reader (nil: in this
// process), as Syncer.openPages does for a checkpoint.
func openSource(ctx context.Context, reader *PageReader, abs string, since *pageread.WALPos) (pageread.Source, error) {
	if reader == nil {
		return pageread.Open(ctx, abs, since)
	}
	return reader.open(ctx, abs, since)
}

// walk lists the regular files of the data dir that may be databases (not SQLite's -wal,
// -shm and -journal files beside another file) and the odd files it skips. It reads the
// directories again only when one changed since the last walk: a file created, removed or
// renamed moves its directory's mtime, so each directory's signature, taken before it was
// read and settled (older than racyMargin), vouches for the last walk's answer; a stat of
// each directory then replaces reading it.
func (l *LogShipper) walk(ctx context.Context, now time.Time) ([]string, []SkippedFile, error) {
	if w := l.walked; w != nil && w.still(now) {
		return w.files, slices.Clip(w.skipped), nil
	}
	l.walked = nil
	l.walks++
	w := &walked{dirs: make(map[string]fileSig)}
	var files []string
	var skipped []SkippedFile
	names := make(map[string]bool)
	err := filepath.WalkDir(l.dataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				w = nil // removed while we walked, or no data dir: nothing to ship, nothing to keep
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() && w != nil {
			sig, err := statSig(p, now) // before WalkDir reads it
			if err != nil || !sig.exists {
				w = nil
			} else {
				w.dirs[p] = sig
			}
		}
		if p == l.dataDir {
			return nil
		}
		rel, err := filepath.Rel(l.dataDir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if k := oddKind(d.Type()); k != "" {
			skipped = append(skipped, SkippedFile{Path: rel, Kind: k})
			return nil
		}
		if !d.IsDir() {
			files = append(files, rel)
			names[rel] = true
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	out := files[:0]
	for _, rel := range files {
		if !isSidecarName(rel, names) {
			out = append(out, rel)
		}
	}
	if w != nil {
		w.files, w.skipped = out, skipped
		l.walked = w
	}
	return out, slices.Clip(skipped), nil
}

// walked is one walk of a data dir: what it found, and the signature of each directory it
// read, taken before reading it.
type walked struct {
	dirs    map[string]fileSig
	files   []string
	skipped []SkippedFile
}

// still reports whether every directory of the walk keeps its signature, each settled
// (taken more than racyMargin after the directory's last change): nothing was created,
// removed or renamed in them since they were read.
func (w *walked) still(now time.Time) bool {
	for p, sig := range w.dirs {
		if !sig.settled() {
			return false
		}
		cur, err := statSig(p, now)
		if err != nil || !cur.same(sig) {
			return false
		}
	}
	return true
}

// isSidecarName reports whether rel is named as SQLite's -wal, -shm or -journal file of
// another file of names.
func isSidecarName(rel string, names map[string]bool) bool {
	for _, suf := range sidecarSuffixes {
		if base, ok := strings.CutSuffix(rel, suf); ok && path.Base(base) != "" && names[base] {
			return true
		}
	}
	return false
}

// Kinds of file, as Next sees them.
const (
	kindWALDB      = "wal database"
	kindRollbackDB = "rollback-journal database"
	kindFile       = "file"
)

// kindSig is what a file was found to be, and the signature it had then.
type kindSig struct {
	sig  fileSig
	kind string
}

// kind says what the file at abs is: a database in WAL mode (the file format bytes of its
// header say 2), one in rollback-journal mode, or another file. The answer is cached while
// the file's signature stays and is older than racyMargin.
func (l *LogShipper) kind(rel, abs string, sig fileSig, now time.Time) (string, error) {
	if k, ok := l.kinds[rel]; ok && k.sig.same(sig) && k.sig.settled() {
		return k.kind, nil
	}
	f, err := os.OpenFile(abs, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		if err == nil {
			err = fmt.Errorf("not a regular file (%v)", fi.Mode().Type())
		}
		return "", err
	}
	hdr := make([]byte, 20)
	n, _ := f.ReadAt(hdr, 0)
	kind := kindFile
	switch {
	case n < len(hdr) || string(hdr[:len(sqliteHeader)]) != string(sqliteHeader):
	case hdr[18] == 2 && hdr[19] == 2:
		kind = kindWALDB
	default:
		kind = kindRollbackDB
	}
	l.kinds[rel] = kindSig{sig: sig, kind: kind}
	return kind, nil
}

// fileSig is a file's stat signature: a write moves its size or mtime. ctime, which only
// the kernel sets, would be stronger, but SQLite running as root fchowns the WAL at every
// open (a checkpoint's or this shipper's view too), which moves it; an instance that sets its
// WAL's mtime back only keeps its own writes out of the log until the next checkpoint. at
// is when the signature was taken (the caller's wall clock), so a signature whose mtime is
// within racyMargin of it is never trusted to mean "unchanged": a write in the same
// timestamp tick could have left it as it was.
type fileSig struct {
	exists bool
	ino    uint64
	size   int64
	mtime  int64
	at     int64
}

// settled reports whether the signature can vouch for the content: taken more than
// racyMargin after the file's last write.
func (s fileSig) settled() bool {
	return !s.exists || s.mtime < s.at-int64(racyMargin)
}

// same compares two signatures, not when they were taken.
func (s fileSig) same(o fileSig) bool {
	s.at, o.at = 0, 0
	return s == o
}

// dbSig is the signature of a database and of its WAL.
type dbSig struct{ main, wal fileSig }

// unchanged reports whether cur shows nothing committed since s was taken (before the view
// that read the database).
func (s dbSig) unchanged(cur dbSig) bool {
	return s.main.same(cur.main) && s.wal.same(cur.wal) && s.main.settled() && s.wal.settled()
}

func statDBSig(abs string, now time.Time) (dbSig, error) {
	var s dbSig
	var err error
	if s.main, err = statSig(abs, now); err != nil {
		return s, err
	}
	if !s.main.exists {
		return s, fs.ErrNotExist
	}
	s.wal, err = statSig(abs+"-wal", now)
	return s, err
}

func statSig(p string, now time.Time) (fileSig, error) {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return fileSig{at: now.UnixNano()}, nil
	}
	if err != nil {
		return fileSig{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileSig{}, fmt.Errorf("no stat for %s", filepath.Base(p))
	}
	return fileSig{exists: true, ino: st.Ino, size: fi.Size(), mtime: fi.ModTime().UnixNano(), at: now.UnixNano()}, nil
}
