package spacestore

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

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
