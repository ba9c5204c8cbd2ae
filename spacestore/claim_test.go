package spacestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// writeFile writes one file into a syncer's data dir.
func writeFile(t *testing.T, s *Syncer, name, body string) {
	t.Helper()
	if err := os.MkdirAll(s.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.DataDir, name), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A new holder that fenced makes an older holder's pending checkpoint fail, and its own
// checkpoints then land: the writes its instance acknowledged are kept. Without the fence
// the old holder's late swap lands on the ETag both read, and the new holder's first
// checkpoint is the one fenced out.
func TestFenceAtTakeoverStopsAnOlderHoldersLateWrite(t *testing.T) {
	for _, tc := range []struct {
		name       string
		checkpoint bool // the old holder checkpointed once before (else no manifest yet)
		fullFile   bool
	}{
		{"manifest", true, false},
		{"no manifest yet", false, false},
		{"format 1", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
				ctx := context.Background()
				now := time.Now()
				old := newSyncer(t, b, t.TempDir())
				old.FullFile = tc.fullFile
				old.WrittenBy = "old"
				if err := old.Load(ctx); err != nil {
					t.Fatal(err)
				}
				if tc.checkpoint {
					writeFile(t, old, "a", "acknowledged by the old holder")
					if _, err := old.Checkpoint(ctx, Periodic, nil, now); err != nil {
						t.Fatal(err)
					}
				}
				// The old holder has a write in flight that it does not get to send yet.
				writeFile(t, old, "b", "pending on the old holder")

				nu := newSyncer(t, b, t.TempDir())
				nu.FullFile = tc.fullFile
				nu.WrittenBy = "new"
				if err := nu.Load(ctx); err != nil {
					t.Fatal(err)
				}
				if err := nu.Restore(ctx); err != nil {
					t.Fatal(err)
				}
				claim := Claim{Holder: "new", Incarnation: "i2", Lease: `"lease-etag"`, At: now}
				if err := nu.Fence(ctx, claim); err != nil {
					t.Fatal(err)
				}
				writeFile(t, nu, "c", "acknowledged by the new holder")

				if _, err := old.Checkpoint(ctx, Periodic, nil, now.Add(time.Second)); !errors.Is(err, ErrFenced) {
					t.Fatalf("old holder's late checkpoint = %v, want ErrFenced", err)
				}
				st, err := nu.Checkpoint(ctx, Periodic, nil, now.Add(2*time.Second))
				if err != nil || !st.ManifestWritten {
					t.Fatalf("new holder's checkpoint = %+v, %v", st, err)
				}
				m, _, err := ReadManifest(ctx, b, "s.test")
				if err != nil {
					t.Fatal(err)
				}
				if m.Claim == nil || *m.Claim != (Claim{Holder: "new", Incarnation: "i2", Lease: `"lease-etag"`, At: now.UTC()}) {
					t.Fatalf("checkpoint's claim = %+v, want the new holder's", m.Claim)
				}
				var names []string
				for _, f := range m.Files {
					names = append(names, f.Path)
				}
				want := "[c]"
				if tc.checkpoint {
					want = "[a c]"
				}
				if got := fmt.Sprint(names); got != want {
					t.Fatalf("files in the bucket = %s, want %s", got, want)
				}
			})
		})
	}
}

// An older holder's write that lands between the new holder's read and its fence makes the
// fence fail (nothing is overwritten): the new holder reads and restores that newer state,
// and its next fence lands.
func TestFenceFailsWhenALateWriteLandedFirst(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		now := time.Now()
		old := newSyncer(t, b, t.TempDir())
		if err := old.Load(ctx); err != nil {
			t.Fatal(err)
		}
		writeFile(t, old, "a", "one")
		if _, err := old.Checkpoint(ctx, Periodic, nil, now); err != nil {
			t.Fatal(err)
		}
		nu := newSyncer(t, b, t.TempDir())
		if err := nu.Load(ctx); err != nil {
			t.Fatal(err)
		}
		writeFile(t, old, "b", "landed late")
		if _, err := old.Checkpoint(ctx, Periodic, nil, now.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		claim := Claim{Holder: "new", Incarnation: "i2", Lease: `"l"`, At: now}
		if err := nu.Fence(ctx, claim); !errors.Is(err, ErrFenced) {
			t.Fatalf("fence over a changed manifest = %v, want ErrFenced", err)
		}
		if m, _, _ := ReadManifest(ctx, b, "s.test"); m.Claim != nil || m.Generation != 2 {
			t.Fatalf("manifest after a failed fence = %+v, want the old holder's generation 2", m)
		}
		if err := nu.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if err := nu.Restore(ctx); err != nil {
			t.Fatal(err)
		}
		if err := nu.Fence(ctx, claim); err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(filepath.Join(nu.DataDir, "b")); err != nil || string(data) != "landed late" {
			t.Fatalf("restored b = %q, %v", data, err)
		}
		m, _, err := ReadManifest(ctx, b, "s.test")
		if err != nil || m.Generation != 2 || len(m.Files) != 2 || m.Claim == nil {
			t.Fatalf("fenced manifest = %+v, %v; want generation 2, its two files, claimed", m, err)
		}
		if _, err := old.Checkpoint(ctx, Periodic, nil, now.Add(2*time.Second)); err != nil {
			t.Fatal(err) // nothing changed on the old holder: no write at all
		}
		writeFile(t, old, "c", "later")
		if _, err := old.Checkpoint(ctx, Periodic, nil, now.Add(3*time.Second)); !errors.Is(err, ErrFenced) {
			t.Fatalf("old holder after the fence = %v, want ErrFenced", err)
		}
	})
}
