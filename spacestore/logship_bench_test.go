package spacestore

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkLogCut is what one cut costs the box: a LogShipper's Next (with kept
// connections, as the engine makes it) after `commits` small commits of its own (one
// ~300-byte row each, the way demo chat messages land) into a table of 10k (3.4 MB) or
// 100k (34 MB) such rows with an index, outside the timing. The database keeps SQLite's
// default autocheckpoint, so the WAL restarts now and then (restarts/op), as in a running
// space; the cut after a restart it cannot follow pays for a full compare of every page
// (full-compares/op). "in-process" reads the pages
// in this process; "isolated" through lchat-pageread under the space's uid (root only).
// CPU-ns/op is this process's CPU time in Next (ns/op also counts the waits of a loaded
// machine), helper-CPU-ns/op the helper's, which this process's profile leaves out:
//
//	go test ./spacestore -run '^$' -bench LogCut/10000rows -benchtime 300x -count 3
func BenchmarkLogCut(b *testing.B) {
	for _, rows := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("%drows", rows), func(b *testing.B) { benchLogCut(b, rows) })
	}
}

func benchLogCut(b *testing.B, rows int) {
	const rowBytes, commits = 300, 17
	ctx := context.Background()
	dir, p, reader := benchSpace(b)
	db := openDB(b, p)
	fillDB(b, db, rows, rowBytes)
	if reader != nil {
		handTo(b, dir, testSpaceUID)
	}
	claim := Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`, At: time.Unix(1e9, 0)}
	body := make([]byte, rowBytes)
	write := func(b *testing.B, db *sql.DB) {
		for range commits {
			rand.Read(body)
			if _, err := db.Exec("INSERT INTO messages (room, created_at, body) VALUES (?, ?, ?)", 3, time.Now().UnixNano(), body); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, where := range []string{"in-process", "isolated"} {
		r := reader
		if where == "in-process" {
			r = nil
		} else if reader == nil {
			continue
		}
		b.Run(fmt.Sprintf("%s/%dcommits", where, commits), func(b *testing.B) {
			l := NewLogShipper(dir, r, nil, 1, 1, claim)
			defer l.Close()
			if _, err := l.Next(ctx, time.Now()); err != nil {
				b.Fatal(err)
			}
			ltxBytes, restarts, scans, cpu := 0, 0, l.fullScans, time.Duration(0)
			helper := helperCPU(l)
			for b.Loop() {
				salt := l.dbs["app.db"].wal.Salt1
				b.StopTimer()
				write(b, db)
				b.StartTimer()
				cpu0 := processCPU()
				seg, err := l.Next(ctx, time.Now())
				cpu += processCPU() - cpu0
				if err != nil || seg == nil {
					b.Fatalf("Next = %v, %v", seg, err)
				}
				ltxBytes += len(seg.DBs[0].LTX)
				if l.dbs["app.db"].wal.Salt1 != salt {
					restarts++ // the WAL restarted
				}
			}
			b.ReportMetric(float64(ltxBytes)/float64(b.N), "LTX-bytes/op")
			b.ReportMetric(float64(restarts)/float64(b.N), "restarts/op")
			b.ReportMetric(float64(l.fullScans-scans)/float64(b.N), "full-compares/op")
			b.ReportMetric(float64(cpu)/float64(b.N), "CPU-ns/op")
			if r != nil {
				b.ReportMetric(float64(helperCPU(l)-helper)/float64(b.N), "helper-CPU-ns/op")
			}
		})
	}
}

// processCPU is the CPU time (user and system) this process has used so far: what a cut
// costs the box, apart from the wait on a loaded machine that ns/op also counts.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// helperCPU is the CPU time (user and system) the kept lchat-pageread process of l has
// used so far, 0 when none runs: the isolated half's cost the box pays outside this
// process's profile. /proc counts in clock ticks (10 ms), so it is meaningful over many
// cuts only.
func helperCPU(l *LogShipper) time.Duration {
	hv, ok := l.keep.(*HelperViews)
	if !ok {
		return 0
	}
	hv.mu.Lock()
	h := hv.h
	hv.mu.Unlock()
	if h == nil || h.cmd.Process == nil {
		return 0
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis: state is the 3rd field, utime the
	// 14th, stime the 15th.
	f := bytes.Fields(stat[bytes.LastIndexByte(stat, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(string(f[11]), 10, 64)
	st, _ := strconv.ParseInt(string(f[12]), 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// BenchmarkSegmentCut is one cut of a busy space's WAL tail and its encoding, without the
// writes and the walk that BenchmarkLogCut times too: the shipper's read of app.db (10k
// rows of ~300 bytes and an index) since a position 17 commits back (a row each, 2 or 3
// frames), its LTX file, and EncodeSegment of the segment. The WAL restarted before the
// position, so frames of its earlier use follow the tail, as in a running space. The WAL
// does not move: every cut reads the same tail, and its new state is dropped. CPU-ns/op is
// this process's CPU time, the GC's work included, a loaded machine's waits not:
//
//	go test ./spacestore -run '^$' -bench SegmentCut -benchmem -count 5
func BenchmarkSegmentCut(b *testing.B) {
	const rowBytes, commits = 300, 17
	ctx := context.Background()
	dir := filepath.Join(b.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	p := filepath.Join(dir, "app.db")
	db := openDB(b, p)
	fillDB(b, db, 10_000, rowBytes) // past the autocheckpoint: the next write restarts the WAL
	body := make([]byte, rowBytes)
	write := func() {
		rand.Read(body)
		if _, err := db.Exec("INSERT INTO messages (room, created_at, body) VALUES (?, ?, ?)", 3, time.Now().UnixNano(), body); err != nil {
			b.Fatal(err)
		}
	}
	write()
	claim := Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`, At: time.Unix(1e9, 0)}
	l := NewLogShipper(dir, nil, nil, 1, 1, claim)
	defer l.Close()
	if _, err := l.Next(ctx, time.Now()); err != nil {
		b.Fatal(err)
	}
	prev := l.dbs["app.db"]
	for range commits {
		write()
	}
	now, scans := time.Now(), l.fullScans
	var frames int64
	var segBytes int
	cpu0 := processCPU()
	for b.Loop() {
		d, st, err := l.read(ctx, p, "app.db", prev, now)
		if err != nil || d == nil {
			b.Fatalf("read = %v, %v", d, err)
		}
		data, err := EncodeSegment(&Segment{Gen: l.gen, Seq: l.next, Claim: claim, DBs: []SegmentDB{*d}})
		if err != nil {
			b.Fatal(err)
		}
		frames, segBytes = st.wal.Frames-prev.wal.Frames, len(data)
		l.spare = st.hashes // dropped, as Next drops the state it replaces
	}
	if l.fullScans != scans || prev.wal.Salt1 != l.dbs["app.db"].wal.Salt1 {
		b.Fatal("the cut did not follow the tail")
	}
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "CPU-ns/op")
	b.ReportMetric(float64(frames)/commits, "frames/commit")
	b.ReportMetric(float64(segBytes), "segment-bytes")
}
