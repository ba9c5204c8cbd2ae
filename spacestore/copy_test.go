package spacestore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// checkpoint stores files as a space checkpoint of generation gen in b: the blobs, then
// the manifest (CAS on whatever manifest is there).
func checkpoint(t *testing.T, b bucket.Bucket, host string, gen int64, files map[string]string) *spacestore.Manifest {
	t.Helper()
	ctx := context.Background()
	m := &spacestore.Manifest{Generation: gen, WrittenBy: "https://src.test", WrittenAt: time.Now().UTC().Truncate(time.Second)}
	for path, body := range files {
		sum := sha256.Sum256([]byte(body))
		f := spacestore.File{Path: path, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:]), Mode: 0o600}
		if _, err := b.Put(ctx, spacestore.BlobKey(host, f.SHA256), strings.NewReader(body), f.Size, bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
		m.Files = append(m.Files, f)
	}
	_, etag, err := spacestore.ReadManifest(ctx, b, host)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spacestore.WriteManifest(ctx, b, host, m, etag); err != nil {
		t.Fatal(err)
	}
	return m
}

func putLease(t *testing.T, b bucket.Bucket, host string, l spacestore.Lease) {
	t.Helper()
	raw, _ := json.Marshal(l)
	if _, err := b.Put(context.Background(), spacestore.LeaseKey(host), bytes.NewReader(raw), int64(len(raw)), bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, b bucket.Bucket, key string) string {
	t.Helper()
	obj, err := b.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer obj.Body.Close()
	raw, err := io.ReadAll(obj.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func liveSet(selfs ...string) spacestore.LiveFunc {
	return func(holder, _ string) bool {
		for _, s := range selfs {
			if s == holder {
				return true
			}
		}
		return false
	}
}

// TestCopySpaceAcrossBuckets relocates a checkpointed space between two real S3
// servers (per-region buckets) and checks what the operator relies on: the bytes
// arrive, the lease stays behind, a re-run changes nothing, a newer destination is
// never overwritten, and an awake space is refused with nothing written.
func TestCopySpaceAcrossBuckets(t *testing.T) {
	ctx := context.Background()
	srcS3, dstS3 := harness.StartS3(t), harness.StartS3(t)
	src, dst := srcS3.NewBucket(t, "ie/"), dstS3.NewBucket(t, "fi/")
	const host = "8oe.example.com"
	files := map[string]string{"room.db": strings.Repeat("sqlite page ", 50000), "uploads/a.txt": "hello", "uploads/b.txt": "hello"}
	want := checkpoint(t, src, host, 3, files)
	putLease(t, src, host, spacestore.Lease{Holder: "https://ie1.test", Incarnation: "i1", Released: true})
	nobody := liveSet()

	t.Run("copies blobs and manifest, not the lease", func(t *testing.T) {
		res, err := spacestore.CopySpace(ctx, src, dst, host, nobody, nobody)
		if err != nil {
			t.Fatal(err)
		}
		if res.Skipped || res.Generation != 3 || res.Blobs != 2 {
			t.Errorf("result %+v, want generation 3 with 2 blobs (two files share content)", res)
		}
		got, _, err := spacestore.ReadManifest(ctx, dst, host)
		if err != nil || got == nil {
			t.Fatalf("destination manifest: %v %v", got, err)
		}
		if got.Generation != want.Generation || !slices.Equal(got.Files, want.Files) {
			t.Errorf("destination manifest %+v, want %+v", got, want)
		}
		for _, f := range want.Files {
			if body := readAll(t, dst, spacestore.BlobKey(host, f.SHA256)); body != files[f.Path] {
				t.Errorf("blob of %s: %d bytes differ from the source", f.Path, len(body))
			}
		}
		if _, err := dst.Head(ctx, spacestore.LeaseKey(host)); !errors.Is(err, bucket.ErrNotFound) {
			t.Errorf("lease in the destination: err=%v, want not found", err)
		}
	})

	t.Run("re-run is a no-op", func(t *testing.T) {
		before, err := dst.Head(ctx, spacestore.ManifestKey(host))
		if err != nil {
			t.Fatal(err)
		}
		res, err := spacestore.CopySpace(ctx, src, dst, host, nobody, nobody)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Skipped || res.Blobs != 0 {
			t.Errorf("re-run result %+v, want skipped", res)
		}
		after, _ := dst.Head(ctx, spacestore.ManifestKey(host))
		if after.ETag != before.ETag {
			t.Errorf("re-run rewrote the destination manifest")
		}
	})

	t.Run("newer destination is left alone", func(t *testing.T) {
		newer := checkpoint(t, dst, host, 5, map[string]string{"room.db": "written in fi"})
		checkpoint(t, src, host, 4, map[string]string{"room.db": "older, written in ie"})
		res, err := spacestore.CopySpace(ctx, src, dst, host, nobody, nobody)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Skipped || res.DestGeneration != 5 {
			t.Errorf("result %+v, want skipped at destination generation 5", res)
		}
		got, _, _ := spacestore.ReadManifest(ctx, dst, host)
		if got.Generation != 5 || !slices.Equal(got.Files, newer.Files) {
			t.Errorf("destination manifest is now %+v; the newer one was overwritten", got)
		}
	})

	t.Run("refused while awake", func(t *testing.T) {
		const awake = "awake.example.com"
		checkpoint(t, src, awake, 1, map[string]string{"room.db": "live"})
		putLease(t, src, awake, spacestore.Lease{Holder: "https://ie1.test", Incarnation: "i1"})
		_, err := spacestore.CopySpace(ctx, src, dst, awake, liveSet("https://ie1.test"), nobody)
		if !errors.Is(err, spacestore.ErrSpaceAwake) {
			t.Fatalf("copy of an awake space: err=%v, want ErrSpaceAwake", err)
		}
		var ae *spacestore.AwakeError
		if !errors.As(err, &ae) || ae.Holder != "https://ie1.test" || !strings.Contains(err.Error(), "https://ie1.test") {
			t.Errorf("refusal %q does not say where the space is awake", err)
		}
		if m, _, _ := spacestore.ReadManifest(ctx, dst, awake); m != nil {
			t.Errorf("an awake space's manifest reached the destination")
		}
		// Awake in the destination region (a box there holds its lease): refused too.
		putLease(t, src, awake, spacestore.Lease{Holder: "https://ie1.test", Incarnation: "i1", Released: true})
		putLease(t, dst, awake, spacestore.Lease{Holder: "https://fi1.test", Incarnation: "f1"})
		if _, err := spacestore.CopySpace(ctx, src, dst, awake, nobody, liveSet("https://fi1.test")); !errors.Is(err, spacestore.ErrSpaceAwake) {
			t.Fatalf("copy over a space awake in the destination: err=%v, want ErrSpaceAwake", err)
		}
		// A dead holder's lease is free: the copy goes ahead.
		putLease(t, src, awake, spacestore.Lease{Holder: "https://ie1.test", Incarnation: "i1"})
		if res, err := spacestore.CopySpace(ctx, src, dst, awake, nobody, nobody); err != nil || res.Generation != 1 {
			t.Fatalf("copy with a dead holder's lease: %+v %v", res, err)
		}
	})
}

// TestCopySpaceCarriesHistory: a relocated space keeps its point-in-time history: the
// destination lists the source's checkpoints, and restoring an old one there brings back
// that state (its objects came along); a re-run copies nothing more.
func TestCopySpaceCarriesHistory(t *testing.T) {
	ctx := context.Background()
	newFB := func() bucket.Bucket {
		b, err := filebucket.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	src, dst := newFB(), newFB()
	const host = "hist.example.com"
	dir := t.TempDir()
	s := &spacestore.Syncer{Bucket: src, Host: host, DataDir: filepath.Join(dir, "data"), WorkDir: filepath.Join(dir, "work"), WrittenBy: "test"}
	if err := os.MkdirAll(s.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	states := []string{"one", "second state", "the third state of notes"}
	for i, body := range states {
		if err := os.WriteFile(filepath.Join(s.DataDir, "notes.txt"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Checkpoint(ctx, spacestore.Periodic, nil, time.Now().Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := spacestore.CopySpace(ctx, src, dst, host, liveSet(), liveSet())
	if err != nil {
		t.Fatal(err)
	}
	hist, _, err := spacestore.History(ctx, dst, host)
	if err != nil {
		t.Fatal(err)
	}
	var gens []int64
	for _, cp := range hist {
		gens = append(gens, cp.Generation)
	}
	if res.History != len(states) || !slices.Equal(gens, []int64{1, 2, 3}) {
		t.Fatalf("copied %d history entries; destination lists generations %v, want [1 2 3]", res.History, gens)
	}
	if _, err := spacestore.RestoreTo(ctx, dst, host, spacestore.Holder{ID: "cli", Incarnation: "1"}, spacestore.Target{Generation: 1}, spacestore.DefaultRetention, time.Now()); err != nil {
		t.Fatalf("restoring generation 1 in the destination: %v", err)
	}
	r := &spacestore.Syncer{Bucket: dst, Host: host, DataDir: filepath.Join(dir, "r", "data"), WorkDir: filepath.Join(dir, "r", "work")}
	if err := r.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(r.DataDir, "notes.txt")); string(got) != states[0] {
		t.Fatalf("restored %q, want %q", got, states[0])
	}
	// The source is unchanged and the destination newer now: a re-run leaves it alone.
	again, err := spacestore.CopySpace(ctx, src, dst, host, liveSet(), liveSet())
	if err != nil || !again.Skipped || again.History != 0 {
		t.Fatalf("re-run: %+v, %v", again, err)
	}
}
