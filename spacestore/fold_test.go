package spacestore

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// chainDB checkpoints a database of about rows KiB, then n more checkpoints of one row each.
func chainDB(t *testing.T, b bucket.Bucket, rows, n int) (*Syncer, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	s := newSyncer(t, b, t.TempDir())
	os.MkdirAll(s.DataDir, 0o700)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(s.DataDir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	fillDB(t, db, rows, 1000)
	for range n + 1 {
		if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		fillDB(t, db, 1, 1000)
	}
	return s, db
}

// TestFinalCheckpointFoldsTheChain: the checkpoint before a space sleeps leaves its next
// wake the base and at most one delta (a small database: the base alone), and the restored
// database is exact; a final checkpoint with nothing to fold writes nothing.
func TestFinalCheckpointFoldsTheChain(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rows       int
		wantDeltas int
	}{
		{"small", 1000, 0}, // ~1 MB: one base chunk
		{"large", 6000, 1}, // ~6 MB: three base chunks, page 1's among them
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			b := backends["file"](t)
			s, db := chainDB(t, b, tc.rows, 12)
			// One more row committed, taken by a periodic checkpoint: the final one then
			// sees no change and must still fold.
			if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
				t.Fatal(err)
			}
			img := s.manifest.Files[0].Content.DB
			if len(img.Deltas) < 2 && tc.name == "large" {
				t.Fatalf("setup: chain of %d deltas, want several", len(img.Deltas))
			}
			if len(img.Deltas) < 1 {
				t.Fatalf("setup: chain of %d deltas, want some", len(img.Deltas))
			}
			db.Close()
			st, err := s.Checkpoint(ctx, Final, nil, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			img = s.manifest.Files[0].Content.DB
			if !st.ManifestWritten || len(img.Deltas) != tc.wantDeltas {
				t.Fatalf("final checkpoint: manifest written %v, %d deltas; want %d", st.ManifestWritten, len(img.Deltas), tc.wantDeltas)
			}
			r := restoreInto(t, b)
			if got := rows(t, filepath.Join(r.DataDir, "app.db")); got != tc.rows+13 {
				t.Fatalf("restored %d rows, want %d", got, tc.rows+13)
			}
			st, err = s.Checkpoint(ctx, Final, nil, time.Now())
			if err != nil || st.ManifestWritten || st.BlobsUploaded != 0 {
				t.Fatalf("second final checkpoint: %+v %v, want nothing written", st, err)
			}
			// The box that woke from the folded image continues the chain with a delta.
			rdb := openDB(t, filepath.Join(r.DataDir, "app.db"))
			fillDB(t, rdb, 1, 1000)
			st, err = r.Checkpoint(ctx, Periodic, nil, time.Now())
			if err != nil || st.BytesUploaded > 64<<10 {
				t.Fatalf("checkpoint after the wake: %d bytes, %v", st.BytesUploaded, err)
			}
			rdb.Close()
			if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != tc.rows+14 {
				t.Fatalf("restored %d rows, want %d", got, tc.rows+14)
			}
		})
	}
}

// TestRestoreDetectsCorruptDatabaseObjects: a database's base chunks and deltas are not
// hashed with SHA-256 at a wake; a flipped byte in either still fails the restore (page
// checksum; LTX checksum or decoding) and leaves the data directory alone.
func TestRestoreDetectsCorruptDatabaseObjects(t *testing.T) {
	for _, which := range []string{"base", "delta"} {
		t.Run(which, func(t *testing.T) {
			ctx := context.Background()
			b := backends["file"](t)
			s, _ := chainDB(t, b, 3000, 2)
			img := s.manifest.Files[0].Content.DB
			ref := img.Base[len(img.Base)-1]
			if which == "delta" {
				ref = img.Deltas[len(img.Deltas)-1].Ref
			}
			obj, err := b.Get(ctx, RefKey("s.test", ref))
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(obj.Body)
			obj.Body.Close()
			data[len(data)/2] ^= 0x40
			if _, err := b.Put(ctx, RefKey("s.test", ref), bytes.NewReader(data), int64(len(data)), bucket.Cond{}); err != nil {
				t.Fatal(err)
			}
			r := newSyncer(t, b, t.TempDir())
			os.MkdirAll(r.DataDir, 0o700)
			os.WriteFile(filepath.Join(r.DataDir, "keep"), []byte("old"), 0o600)
			r.Load(ctx)
			err = r.Restore(ctx)
			if err == nil || !strings.Contains(err.Error(), "restoring app.db") {
				t.Fatalf("restore of a corrupt %s = %v, want an error naming the database", which, err)
			}
			if data, err := os.ReadFile(filepath.Join(r.DataDir, "keep")); err != nil || string(data) != "old" {
				t.Fatalf("failed restore touched the data dir: %q %v", data, err)
			}
		})
	}
}

// TestCheckpointGCHonoursGrace: the collection a checkpoint runs keeps unreferenced objects
// younger than the syncer's GCGrace (default an hour) and deletes them once older.
func TestCheckpointGCHonoursGrace(t *testing.T) {
	for _, tc := range []struct {
		grace      time.Duration
		wantDelete bool
	}{{0, false}, {time.Nanosecond, true}} {
		b := backends["file"](t)
		s, write := newChat(t, b, 500)
		s.Retention, s.GCGrace = time.Nanosecond, tc.grace // only the newest generations are retained
		write(gcInterval - 1)
		before := len(listKeys(t, b, "spaces/s.test/objs/"))
		write(1) // generation gcInterval: collects
		after := len(listKeys(t, b, "spaces/s.test/objs/"))
		if deleted := after < before; deleted != tc.wantDelete {
			t.Fatalf("grace %v: %d objects before the collection, %d after; want deleted %v", tc.grace, before, after, tc.wantDelete)
		}
	}
}
