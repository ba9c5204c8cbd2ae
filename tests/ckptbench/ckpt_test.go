// Package ckptbench prints the checkpoint figures of issue 11 against versitygw, format 1
// (full-file: VACUUM INTO + whole-file upload, main's mode before page deltas) side by side
// with format 2 (page deltas, chunks, history, GC) in one run:
//
//   - a large SQLite database with one 1 KiB row added: bytes uploaded and time per checkpoint;
//   - one row per checkpoint for N checkpoints: bucket bytes and objects after GC;
//   - restore ("wake" minus process start) p50/p99 for 1 MB and a large database, straight
//     to versitygw (after a crash: the chain as periodic checkpoints and the background folds
//     after them left it; after a sleep: its final checkpoint folded the chain) and through
//     an S3-like link (per-connection bandwidth, first-byte latency). The two formats'
//     restores are interleaved pair by pair (A,B then B,A), warm-up pairs are not kept, and
//     every other sample is (the full form takes 100 per format, size and case);
//   - a point-in-time restore N checkpoints back: time and bytes read.
//
// Short form (CI): 8 MB database, 100 checkpoints. Full figures:
//
//	LCHAT_CKPT_BENCH=full go test ./tests/ckptbench -run TestCheckpointFigures -v -timeout 30m
package ckptbench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/s3bucket"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
	_ "modernc.org/sqlite"
)

// counting counts the bytes a syncer moves through a bucket.
type counting struct {
	bucket.Bucket
	read, written, gets, puts atomic.Int64
}

type countReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r countReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n.Add(int64(n))
	return n, err
}

func (c *counting) Get(ctx context.Context, key string) (*bucket.Object, error) {
	c.gets.Add(1)
	o, err := c.Bucket.Get(ctx, key)
	if err == nil {
		o.Body = countReader{o.Body, &c.read}
	}
	return o, err
}

func (c *counting) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	c.puts.Add(1)
	c.written.Add(size)
	return c.Bucket.Put(ctx, key, body, size, cond)
}

func (c *counting) reset() { c.read.Store(0); c.written.Store(0); c.gets.Store(0); c.puts.Store(0) }

// makeDB writes a chat-like database of about size bytes: messages with an index on
// (room, created_at), ~450-byte text bodies.
func makeDB(t *testing.T, p string, size int) {
	db, err := sql.Open("sqlite", "file:"+p+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.Exec("CREATE TABLE messages (id INTEGER PRIMARY KEY, room INTEGER, created_at INTEGER, body TEXT)")
	db.Exec("CREATE INDEX by_room ON messages (room, created_at)")
	tx, _ := db.Begin()
	raw := make([]byte, 330)
	for i := range size / 480 {
		rand.Read(raw)
		tx.Exec("INSERT INTO messages (room, created_at, body) VALUES (?, ?, ?)", i%50, i, base64.StdEncoding.EncodeToString(raw))
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(dst), 0o700)
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// box is one space written in one format, with its instance's connection held open.
type box struct {
	name string
	s    *spacestore.Syncer
	db   *sql.DB
	row  int
}

func newBox(t *testing.T, b bucket.Bucket, name, host, src string, full bool) *box {
	dir := t.TempDir()
	s := &spacestore.Syncer{Bucket: b, Host: host, DataDir: filepath.Join(dir, "data"), WorkDir: filepath.Join(dir, "work"), WrittenBy: "bench", FullFile: full}
	copyFile(t, src, filepath.Join(s.DataDir, "app.db"))
	db, err := sql.Open("sqlite", "file:"+filepath.Join(s.DataDir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return &box{name: name, s: s, db: db}
}

// addRow inserts one 1 KiB row.
func (x *box) addRow(t *testing.T) {
	raw := make([]byte, 768)
	rand.Read(raw)
	x.row++
	if _, err := x.db.Exec("INSERT INTO messages (room, created_at, body) VALUES (?, ?, ?)", x.row%50, time.Now().UnixNano(), base64.StdEncoding.EncodeToString(raw)); err != nil {
		t.Fatal(err)
	}
}

func (x *box) checkpoint(t *testing.T, mode spacestore.Mode, now time.Time) spacestore.Stats {
	st, err := x.s.Checkpoint(context.Background(), mode, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// periodic is a periodic checkpoint as the engine takes it: the checkpoint, then the
// background fold when the chain grew longer than spacestore.FoldChain (format 2 only).
func (x *box) periodic(t *testing.T, now time.Time) (ckpt, fold spacestore.Stats) {
	ckpt = x.checkpoint(t, spacestore.Periodic, now)
	if !x.s.FullFile && x.s.FoldDue() {
		var err error
		if fold, err = x.s.Fold(context.Background(), now); err != nil {
			t.Fatal(err)
		}
	}
	return ckpt, fold
}

// sideBySide restores two spaces alternately, warm pairs first (not kept), then n pairs;
// the order flips every pair (A,B then B,A) so neither always follows the other. Every
// sample after the warm-up is kept. cpuA and cpuC are the mean CPU time per kept restore
// of this process and of versitygw (whose ticks are 10 ms: only their sum over many
// restores means anything): the work a restore costs, which the machine's other load
// does not change the way it changes latency.
func sideBySide(t *testing.T, b bucket.Bucket, s3 *harness.S3, a, c string, warm, n int) (la, lc []time.Duration, cpuA, cpuC time.Duration) {
	for i := range warm + n {
		var da, dc, ca, cc time.Duration
		if i%2 == 0 {
			da, ca = restoreCPU(t, b, s3, a)
			dc, cc = restoreCPU(t, b, s3, c)
		} else {
			dc, cc = restoreCPU(t, b, s3, c)
			da, ca = restoreCPU(t, b, s3, a)
		}
		if i >= warm {
			la, lc = append(la, da), append(lc, dc)
			cpuA, cpuC = cpuA+ca, cpuC+cc
		}
	}
	return la, lc, cpuA / time.Duration(n), cpuC / time.Duration(n)
}

func restoreCPU(t *testing.T, b bucket.Bucket, s3 *harness.S3, host string) (time.Duration, time.Duration) {
	c0, s0 := selfCPU(), s3.CPU()
	d := restoreOnce(t, b, host)
	return d, selfCPU() - c0 + s3.CPU() - s0
}

// selfCPU is this process's CPU time so far (user + system).
func selfCPU() time.Duration {
	var r syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

func median[T int64 | time.Duration](v []T) T {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

func pct(v []time.Duration, p float64) time.Duration {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[int(float64(len(v)-1)*p+0.5)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }

// restoreOnce loads and restores host into a fresh directory: what a wake does before
// starting the instance.
// A full-file space is restored as main did (FullFile skips format 2's adoption of a
// database blob as a page image), so its figures are today's.
func restoreOnce(t *testing.T, b bucket.Bucket, host string) time.Duration {
	dir := t.TempDir()
	s := &spacestore.Syncer{Bucket: b, Host: host, DataDir: filepath.Join(dir, "data"), WorkDir: filepath.Join(dir, "work"), FullFile: strings.HasPrefix(host, "v1.")}
	start := time.Now()
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	d := time.Since(start)
	os.RemoveAll(dir)
	return d
}

func TestCheckpointFigures(t *testing.T) {
	full := os.Getenv("LCHAT_CKPT_BENCH") == "full"
	// wakes restores of each format per size and case (after warm pairs not kept);
	// linkWakes through the slow link, where a full-file restore takes most of a second.
	bigSize, series, wakes, linkWakes, warm := 8<<20, 100, 10, 5, 1
	if full {
		bigSize, series, wakes, linkWakes, warm = 50<<20, 1000, 100, 30, 3
	}
	if testing.Short() && !full {
		series, wakes, linkWakes = 30, 5, 3
	}
	s3 := harness.StartS3(t)
	cb := &counting{Bucket: s3.NewBucket(t, "bench/")}
	dir := t.TempDir()
	var out strings.Builder
	logf := func(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }
	defer func() { t.Log("\n" + out.String()) }()

	big := filepath.Join(dir, "big.db")
	makeDB(t, big, bigSize)
	fi, _ := os.Stat(big)
	logf("checkpoint figures against versitygw; database %s (%d pages of 4 KiB), 1 KiB rows", mib(fi.Size()), fi.Size()/4096)

	// 1. One row added, per checkpoint, side by side.
	v1 := newBox(t, cb, "full-file", "v1.bench", big, true)
	v2 := newBox(t, cb, "page-delta", "v2.bench", big, false)
	now := time.Now()
	for _, x := range []*box{v1, v2} {
		cb.reset()
		st := x.checkpoint(t, spacestore.Periodic, now)
		logf("%-10s first checkpoint: %s uploaded in %d objects, %s", x.name, mib(cb.written.Load()), st.BlobsUploaded, ms(st.Duration))
	}
	type sample struct {
		bytes []int64
		dur   []time.Duration
	}
	res := map[string]*sample{"full-file": {}, "page-delta": {}}
	for i := range 7 {
		for _, x := range []*box{v1, v2} {
			x.addRow(t)
			cb.reset()
			st := x.checkpoint(t, spacestore.Periodic, now.Add(time.Duration(i+1)*time.Second))
			if i == 0 {
				continue // format 2's first checkpoint after the copy reads the whole WAL-less file once
			}
			res[x.name].bytes = append(res[x.name].bytes, cb.written.Load())
			res[x.name].dur = append(res[x.name].dur, st.Duration)
		}
	}
	a, b := res["full-file"], res["page-delta"]
	logf("\n1. one 1 KiB row added, median of 6 checkpoints (bytes written incl. manifest and history):")
	logf("   full-file : %10d B  %s", median(a.bytes), ms(median(a.dur)))
	logf("   page-delta: %10d B  %s", median(b.bytes), ms(median(b.dur)))
	logf("   ratio     : bytes %.4f (target <= 256 KiB: %v), time %.3f (target <= 0.10)",
		float64(median(b.bytes))/float64(median(a.bytes)), median(b.bytes) <= 256<<10,
		float64(median(b.dur))/float64(median(a.dur)))

	// 2. One row per checkpoint for `series` checkpoints (one a second of bucket time).
	startGen := func() int64 { m, _ := v2.s.Manifest(); return m.Generation }()
	var total time.Duration
	var ckptBytes, foldBytes int64
	folds := 0
	cb.reset()
	for i := range series {
		v2.addRow(t)
		st, fs := v2.periodic(t, now.Add(time.Duration(10+i)*time.Second))
		total += st.Duration
		ckptBytes += st.BytesUploaded
		if fs.ManifestWritten {
			folds++
			foldBytes += fs.BytesUploaded
		}
	}
	m, _ := v2.s.Manifest()
	dbSize := m.Size()
	gs, err := spacestore.Collect(context.Background(), cb, "v2.bench", spacestore.DefaultRetention, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	retainedDeltas := deltaBytes(t, cb, "v2.bench")
	logf("\n2. %d checkpoints of one row each (page-delta), each followed by the background fold when due: %s written in all (incl. manifests and history), mean checkpoint %s",
		series, mib(cb.written.Load()), ms(total/time.Duration(series)))
	logf("   objects: checkpoints %s, %d background folds %s (chain kept <= %d deltas)", mib(ckptBytes), folds, mib(foldBytes), spacestore.FoldChain)
	logf("   after GC, retention 7 days (all %d retained): %d objects, %s + %d history entries", series, gs.Objects, mib(gs.Bytes), gs.History)
	logf("   database %s; deltas referenced by retained checkpoints %s; target <= 2 x db + deltas = %s: %v",
		mib(dbSize), mib(retainedDeltas), mib(2*dbSize+retainedDeltas), gs.Bytes <= 2*dbSize+retainedDeltas)
	logf("   full-file would have written about %s for the same series (%d x its per-checkpoint bytes)", mib(int64(series)*median(a.bytes)), series)

	// 3. Restore latency, alternating formats; 1 MB spaces get the same row-per-checkpoint
	// history. First as the periodic checkpoints left the chain (a wake after a crash), then
	// after the checkpoint a sleep takes once the instance stopped (spacestore.Final), which
	// folds the chain: what a wake after a sleep reads.
	small := filepath.Join(dir, "small.db")
	makeDB(t, small, 1<<20)
	s1 := newBox(t, cb, "full-file", "v1.small", small, true)
	s2 := newBox(t, cb, "page-delta", "v2.small", small, false)
	for i := range 20 {
		for _, x := range []*box{s1, s2} {
			x.addRow(t)
			x.periodic(t, now.Add(time.Duration(i)*time.Second))
		}
	}
	wakeFigures := func(what string) {
		logf("\n3. restore latency (Load + Restore: manifest, download, verify, write), %d wakes of each format per size after %d warm-up pairs, interleaved A,B,B,A..., %s:", wakes, warm, what)
		for _, pair := range [][2]string{{"v1.small", "v2.small"}, {"v1.bench", "v2.bench"}} {
			l1, l2, c1, c2 := sideBySide(t, cb, s3, pair[0], pair[1], warm, wakes)
			mm, _, _ := spacestore.ReadManifest(context.Background(), cb, pair[1])
			img := mm.Files[0].Content.DB
			logf("   %s: full-file p50 %s p99 %s | page-delta p50 %s p99 %s (%d base chunks + %d deltas) | ratio p50 %.2f p99 %.2f",
				mib(mm.Size()), ms(pct(l1, .5)), ms(pct(l1, .99)), ms(pct(l2, .5)), ms(pct(l2, .99)), len(img.Base), len(img.Deltas),
				float64(pct(l2, .5))/float64(pct(l1, .5)), float64(pct(l2, .99))/float64(pct(l1, .99)))
			logf("      CPU per restore (mean, client + versitygw): full-file %s | page-delta %s | ratio %.2f", ms(c1), ms(c2), float64(c2)/float64(c1))
		}
	}
	wakeFigures("after a crash (the chain as periodic checkpoints and their background folds left it)")
	for _, x := range []*box{s2, v2} {
		cb.reset()
		st := x.checkpoint(t, spacestore.Final, now.Add(time.Duration(10+series)*time.Second))
		logf("   %s: the checkpoint at sleep folds the chain: %s written in %d objects, %s", x.s.Host, mib(cb.written.Load()), st.BlobsUploaded, ms(st.Duration))
	}
	wakeFigures("after a sleep (its final checkpoint folded the chain; the issue's figure)")

	// 3b. The same restores through an S3-like link: 80 MB/s per connection, 15 ms to first byte.
	link := startLink(t, strings.TrimPrefix(s3.Endpoint, "http://"), 80e6, 15*time.Millisecond)
	cfg := s3.Config("bench/")
	cfg.Endpoint = "http://" + link.ln.Addr().String()
	slow, err := s3bucket.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	logf("   through an S3-like link (80 MB/s per connection, 15 ms to first byte), %d wakes each after %d warm-up pairs, interleaved:", linkWakes, warm)
	for _, pair := range [][2]string{{"v1.small", "v2.small"}, {"v1.bench", "v2.bench"}} {
		l1, l2, _, _ := sideBySide(t, slow, s3, pair[0], pair[1], warm, linkWakes)
		mm, _, _ := spacestore.ReadManifest(context.Background(), cb, pair[1])
		logf("   %s: full-file p50 %s p99 %s | page-delta p50 %s p99 %s | ratio p50 %.2f p99 %.2f",
			mib(mm.Size()), ms(pct(l1, .5)), ms(pct(l1, .99)), ms(pct(l2, .5)), ms(pct(l2, .99)),
			float64(pct(l2, .5))/float64(pct(l1, .5)), float64(pct(l2, .99))/float64(pct(l1, .99)))
	}

	// 3c. A wake after a sleep on the same box (HRW placement sends a space back to the box it
	// slept on): each format's own syncer and data dir, its instance stopped. Full-file mode
	// (main's) downloads every time; format 2 keeps the data dir when the sleep's final
	// checkpoint recorded it equal to the manifest and nothing changed it since
	// (space/reuse.go). Each wake is followed by a sleep (a final checkpoint, not timed) so
	// the next wake comes after a sleep too.
	logf("\n3c. wake after a sleep on the same box (Load + Restore into the box's own data dir, each wake followed by an untimed sleep), %d wakes of each format per size after %d warm-up pairs, interleaved A,B,B,A...:", wakes, warm)
	tick := now.Add(time.Duration(20+series) * time.Second)
	for _, pair := range [][2]*box{{s1, s2}, {v1, v2}} {
		var lat [2][]time.Duration
		var gets, read [2]int64
		var cpu [2]time.Duration
		reused := 0
		var reuseErr error
		sameBox := func(x *box, k int, keep bool) {
			tick = tick.Add(time.Second)
			st, err := x.s.Checkpoint(context.Background(), spacestore.Final, nil, tick)
			if err != nil {
				t.Fatal(err)
			}
			if st.ReuseErr != nil && !x.s.FullFile {
				reuseErr = st.ReuseErr
			}
			cb.reset()
			c0, s0 := selfCPU(), s3.CPU()
			start := time.Now()
			if err := x.s.Load(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := x.s.Restore(context.Background()); err != nil {
				t.Fatal(err)
			}
			d := time.Since(start)
			c := selfCPU() - c0 + s3.CPU() - s0
			if !keep {
				return
			}
			lat[k] = append(lat[k], d)
			gets[k] += cb.gets.Load()
			read[k] += cb.read.Load()
			cpu[k] += c
			if x.s.Reused() {
				reused++
			}
		}
		for _, x := range pair {
			x.db.Close() // the instance stops
		}
		for i := range warm + wakes {
			if i%2 == 0 {
				sameBox(pair[0], 0, i >= warm)
				sameBox(pair[1], 1, i >= warm)
			} else {
				sameBox(pair[1], 1, i >= warm)
				sameBox(pair[0], 0, i >= warm)
			}
		}
		n := int64(wakes)
		mm, _ := pair[1].s.Manifest()
		logf("   %s: full-file p50 %s p99 %s | page-delta p50 %s p99 %s (data dir kept on %d of %d wakes) | ratio p50 %.2f p99 %.2f",
			mib(mm.Size()), ms(pct(lat[0], .5)), ms(pct(lat[0], .99)), ms(pct(lat[1], .5)), ms(pct(lat[1], .99)), reused, wakes,
			float64(pct(lat[1], .5))/float64(pct(lat[0], .5)), float64(pct(lat[1], .99))/float64(pct(lat[0], .99)))
		logf("      per wake: full-file %d GETs, %s read, CPU %s | page-delta %d GETs, %s read, CPU %s (GETs include the manifest's)",
			gets[0]/n, mib(read[0]/n), ms(cpu[0]/time.Duration(n)), gets[1]/n, mib(read[1]/n), ms(cpu[1]/time.Duration(n)))
		if reuseErr != nil {
			logf("      a sleep could not record its data dir for reuse: %v", reuseErr)
		}
	}

	// 4. Point-in-time restore to the state before the series.
	cb.reset()
	start := time.Now()
	rr, err := spacestore.RestoreTo(context.Background(), cb, "v2.bench", spacestore.Holder{ID: "bench-cli", Incarnation: "1"}, spacestore.Target{Generation: startGen}, spacestore.DefaultRetention, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pitr := time.Since(start)
	pitrRead := cb.read.Load()
	cb.reset()
	wake := restoreOnce(t, cb, "v2.bench")
	logf("\n4. point-in-time restore %d checkpoints back (generation %d -> new generation %d):", series, startGen, rr.Generation)
	logf("   restore command: %s, %d B read; next wake's restore: %s, %s read (%d GETs)", ms(pitr), pitrRead, ms(wake), mib(cb.read.Load()), cb.gets.Load())
}

// deltaBytes sums the delta objects referenced by a space's retained history.
func deltaBytes(t *testing.T, b bucket.Bucket, host string) int64 {
	hist, _, err := spacestore.History(context.Background(), b, host)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var n int64
	for _, cp := range hist {
		obj, err := b.Get(context.Background(), cp.Key)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(obj.Body)
		obj.Body.Close()
		var m spacestore.Manifest
		if err := jsonUnmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		for _, f := range m.Files {
			if f.Content == nil || f.Content.DB == nil {
				continue
			}
			for _, d := range f.Content.DB.Deltas {
				if !seen[d.Key] {
					seen[d.Key] = true
					n += d.Size
				}
			}
		}
	}
	return n
}

var jsonUnmarshal = json.Unmarshal
