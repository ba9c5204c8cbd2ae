package spacestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

// BenchmarkPageRead is what reading a database costs a checkpoint in this process and
// through lchat-pageread under the space's uid (exec, open, read, exit), side by side:
// "scan" reads and hashes every page (a first checkpoint, or one after the WAL was
// reset), "tail" reads the WAL past the last position when nothing changed (a periodic
// checkpoint of an idle database: the helper's fixed cost). Root only:
//
//	go test ./spacestore -run '^$' -bench PageRead -benchtime 20x
func BenchmarkPageRead(b *testing.B) {
	needRoot(b)
	for _, mb := range []int{1, 50} {
		t := b
		fb, ferr := filebucket.New(b.TempDir())
		if ferr != nil {
			b.Fatal(ferr)
		}
		s := spaceDir(t, fb, testSpaceUID, nil)
		p := filepath.Join(s.DataDir, "app.db")
		db := openDB(t, p)
		db.Exec("PRAGMA wal_autocheckpoint=0")
		fillDB(t, db, mb*1000, 1000)
		handTo(t, s.DataDir, testSpaceUID)
		v, err := pageread.Open(context.Background(), p, nil)
		if err != nil {
			b.Fatal(err)
		}
		pos := v.Shape().Pos
		v.Close()
		for _, how := range []string{"in-process", "helper"} {
			open := func(since *pageread.WALPos) (pageread.Source, error) {
				if how == "helper" {
					return s.PageReader.open(context.Background(), p, since)
				}
				return pageread.Open(context.Background(), p, since)
			}
			b.Run(fmt.Sprintf("%dMB/scan/%s", mb, how), func(b *testing.B) {
				for b.Loop() {
					src, err := open(nil)
					if err != nil {
						b.Fatal(err)
					}
					var sum uint64
					if err := src.Scan(func(pg uint32, data []byte) error { sum ^= pageHash(pg, data); return nil }); err != nil {
						b.Fatal(err)
					}
					if err := src.Close(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("%dMB/tail/%s", mb, how), func(b *testing.B) {
				for b.Loop() {
					src, err := open(&pos)
					if err != nil {
						b.Fatal(err)
					}
					if ch, err := src.ChangedSinceTail(); err != nil || len(ch) != 0 {
						b.Fatalf("changed %v, %v", ch, err)
					}
					if err := src.Close(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		db.Close()
	}
}

// BenchmarkViewOpen is what one view of a small database costs when nothing changed since
// the last (open, the changed pages, close), side by side: on a connection of its own
// ("fresh", before connections were kept) and on a kept one, in this process and through
// lchat-pageread under the space's uid (fresh: a helper per view; kept: one helper that
// keeps the connection). The helper's half needs root; it is skipped otherwise:
//
//	go test ./spacestore -run '^$' -bench 'ViewOpen|LogNext' -benchtime 200x
func BenchmarkViewOpen(b *testing.B) {
	ctx := context.Background()
	_, p, reader := benchSpace(b)
	v, err := pageread.Open(ctx, p, nil)
	if err != nil {
		b.Fatal(err)
	}
	pos := v.Shape().Pos
	v.Close()
	keeper := pageread.NewKeeper()
	defer keeper.Close()
	type way struct {
		name string
		open func() (pageread.Source, error)
	}
	ways := []way{
		{"in-process/fresh", func() (pageread.Source, error) { return pageread.Open(ctx, p, &pos) }},
		{"in-process/kept", func() (pageread.Source, error) { return keeper.Open(ctx, p, &pos) }},
	}
	if reader != nil {
		hv := NewHelperViews(reader)
		defer hv.Close()
		ways = append(ways,
			way{"helper/fresh", func() (pageread.Source, error) { return reader.open(ctx, p, &pos) }},
			way{"helper/kept", func() (pageread.Source, error) { return hv.Open(ctx, p, &pos) }})
	}
	for _, w := range ways {
		b.Run(w.name, func(b *testing.B) {
			for b.Loop() {
				src, err := w.open()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := src.ChangedSinceTail(); err != nil {
					b.Fatal(err)
				}
				if err := src.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLogNext is what a LogShipper's Next costs for a segment after one small commit
// (one row, outside the timing), with views that open their own connection ("fresh") or
// keep it, in this process and, for an isolated space, through lchat-pageread (root only).
func BenchmarkLogNext(b *testing.B) {
	ctx := context.Background()
	dir, p, reader := benchSpace(b)
	db := openDB(b, p)
	claim := Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`, At: time.Unix(1e9, 0)}
	readers := map[string]*PageReader{"in-process": nil}
	if reader != nil {
		readers["isolated"] = reader
	}
	for _, where := range []string{"in-process", "isolated"} {
		r, ok := readers[where]
		if !ok {
			continue
		}
		for _, how := range []string{"fresh", "kept"} {
			b.Run(where+"/"+how, func(b *testing.B) {
				l := NewLogShipper(dir, r, nil, 1, 1, claim)
				defer l.Close()
				if how == "fresh" {
					l.keep.Close()
					l.keep = nil
				}
				if _, err := l.Next(ctx, time.Now()); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					b.StopTimer()
					if _, err := db.Exec("INSERT INTO messages (room, created_at, body) VALUES (1, 2, 'hello')"); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					seg, err := l.Next(ctx, time.Now())
					if err != nil || seg == nil {
						b.Fatalf("Next = %v, %v", seg, err)
					}
				}
			})
		}
	}
}

// benchSpace is a data dir holding a small database (app.db, WAL mode, 50 rows), given to
// the space's uid with a PageReader for it when the benchmark runs as root (else reader is
// nil and the helper's half is skipped, said once).
func benchSpace(b *testing.B) (dataDir, p string, reader *PageReader) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Log("not root: the helper's half is skipped (it runs lchat-pageread under a space's uid)")
		dataDir = filepath.Join(b.TempDir(), "data")
		os.Mkdir(dataDir, 0o700)
	} else {
		fb, err := filebucket.New(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		s := spaceDir(b, fb, testSpaceUID, nil)
		dataDir, reader = s.DataDir, s.PageReader
	}
	p = filepath.Join(dataDir, "app.db")
	db := openDB(b, p)
	fillDB(b, db, 50, 100)
	if reader != nil {
		handTo(b, dataDir, testSpaceUID)
	}
	return dataDir, p, reader
}
