package provider

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/spacestore"
)

const (
	testHost = "room.example.com"
	keyA     = mesh.Secret("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
	keyB     = mesh.Secret("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb")
)

// checkpointIn stores files as generation gen of host's space in b.
func checkpointIn(t *testing.T, b bucket.Bucket, gen int64, files map[string]string) {
	t.Helper()
	ctx := context.Background()
	m := &spacestore.Manifest{Generation: gen, WrittenBy: "https://a.test", WrittenAt: time.Now().UTC().Truncate(time.Second)}
	for path, body := range files {
		sum := sha256.Sum256([]byte(body))
		f := spacestore.File{Path: path, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:]), Mode: 0o600}
		if _, err := b.Put(ctx, spacestore.BlobKey(testHost, f.SHA256), strings.NewReader(body), f.Size, bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
		m.Files = append(m.Files, f)
	}
	_, etag, _ := spacestore.ReadManifest(ctx, b, testHost)
	if _, err := spacestore.WriteManifest(ctx, b, testHost, m, etag); err != nil {
		t.Fatal(err)
	}
}

func exportOf(t *testing.T, src bucket.Bucket, key mesh.Secret) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := WriteExport(context.Background(), &buf, src, never, testHost, t.TempDir(), key); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func generation(t *testing.T, b bucket.Bucket) int64 {
	t.Helper()
	m, _, err := spacestore.ReadManifest(context.Background(), b, testHost)
	if err != nil {
		t.Fatal(err)
	}
	if m == nil {
		return 0
	}
	return m.Generation
}

// TestExportRoundTrip: a space's state crosses to another bucket through the export and
// is there as it was; importing it again changes nothing; a newer state there is left
// alone.
func TestExportRoundTrip(t *testing.T) {
	src, dst := membucket.New(), membucket.New()
	checkpointIn(t, src, 7, map[string]string{"data/app.db": "pages", "data/notes.txt": "hello"})
	raw := exportOf(t, src, keyA)
	ctx := context.Background()
	res, err := ReadExport(ctx, bytes.NewReader(raw), dst, never, testHost, t.TempDir(), keyA, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Generation != 7 || generation(t, dst) != 7 {
		t.Fatalf("imported generation %d (res %+v), want 7", generation(t, dst), res)
	}
	if _, err := dst.Head(ctx, spacestore.LeaseKey(testHost)); !errors.Is(err, bucket.ErrNotFound) {
		t.Fatalf("an import wrote a lease: %v", err)
	}
	res, err = ReadExport(ctx, bytes.NewReader(raw), dst, never, testHost, t.TempDir(), keyA, Limits{})
	if err != nil || !res.Skipped {
		t.Fatalf("the same export again: %+v %v, want skipped", res, err)
	}
	checkpointIn(t, dst, 9, map[string]string{"data/notes.txt": "newer"})
	if res, err = ReadExport(ctx, bytes.NewReader(raw), dst, never, testHost, t.TempDir(), keyA, Limits{}); err != nil || !res.Skipped || generation(t, dst) != 9 {
		t.Fatalf("an older export over a newer state: %+v %v, generation %d", res, err, generation(t, dst))
	}
}

// TestBadExportChangesNothing: an export signed with another key, tampered with,
// truncated, over its limits or naming keys outside a space's state is refused and
// leaves the destination bucket empty.
func TestBadExportChangesNothing(t *testing.T) {
	src := membucket.New()
	checkpointIn(t, src, 3, map[string]string{"data/a": strings.Repeat("x", 5000), "data/b": "y"})
	good := exportOf(t, src, keyA)
	flip := bytes.Clone(good)
	flip[len(flip)/2] ^= 1
	lease := []byte(strings.Replace(string(good), "manifest", "lease\x00\x00\x00", 1))
	for _, tc := range []struct {
		name string
		raw  []byte
		key  mesh.Secret
		lim  Limits
	}{
		{"other key", good, keyB, Limits{}},
		{"a flipped bit", flip, keyA, Limits{}},
		{"truncated", good[:len(good)-100], keyA, Limits{}},
		{"no end", good[:bytes.LastIndex(good, []byte("end "))], keyA, Limits{}},
		{"over the bytes", good, keyA, Limits{MaxBytes: 1000}},
		{"over the objects", good, keyA, Limits{MaxObjects: 1}},
		{"another host", []byte(strings.Replace(string(good), testHost, "other.example.com", 1)), keyA, Limits{}},
		{"a lease", lease, keyA, Limits{}},
		{"a path out", []byte(exportMagic + " " + testHost + "\nobj 1 " + strings.Repeat("0", 64) + " ../x\nx"), keyA, Limits{}},
		{"garbage", []byte("\x00\x01garbage"), keyA, Limits{}},
		{"empty", nil, keyA, Limits{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := membucket.New()
			_, err := ReadExport(context.Background(), bytes.NewReader(tc.raw), dst, never, testHost, t.TempDir(), tc.key, tc.lim)
			if !errors.Is(err, ErrBadExport) {
				t.Fatalf("err = %v, want ErrBadExport", err)
			}
			if page, _ := dst.List(context.Background(), "", ""); len(page.Objects) != 0 {
				t.Fatalf("a bad export left %d objects", len(page.Objects))
			}
		})
	}
}

// FuzzReadExport: no input makes the reader panic, hang or write outside a space's state.
func FuzzReadExport(f *testing.F) {
	src := membucket.New()
	ctx := context.Background()
	m := &spacestore.Manifest{Generation: 1}
	spacestore.WriteManifest(ctx, src, testHost, m, "")
	var buf bytes.Buffer
	WriteExport(ctx, &buf, src, never, testHost, f.TempDir(), keyA)
	f.Add(buf.Bytes())
	f.Add([]byte(exportMagic + " " + testHost + "\nend 0 0 00\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		dst := membucket.New()
		_, err := ReadExport(ctx, bytes.NewReader(raw), dst, never, testHost, t.TempDir(), keyA, Limits{MaxBytes: 1 << 20})
		page, _ := dst.List(ctx, "", "")
		for _, o := range page.Objects {
			if !strings.HasPrefix(o.Key, spacePrefix(testHost)) || o.Key == spacestore.LeaseKey(testHost) {
				t.Fatalf("wrote %s (err %v)", o.Key, err)
			}
		}
	})
}

// TestExportCarriesTheNextWake: the space's next scheduled wake, recorded outside its
// prefix, travels in the manifest: the import records none (the destination does not
// serve the space yet, and its scan would drop a due record), restoreWake records it
// from the manifest once the destination serves it.
func TestExportCarriesTheNextWake(t *testing.T) {
	ctx := context.Background()
	src, dst := membucket.New(), membucket.New()
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	m := &spacestore.Manifest{Generation: 4, NextWake: &at}
	if _, err := spacestore.WriteManifest(ctx, src, testHost, m, ""); err != nil {
		t.Fatal(err)
	}
	raw := exportOf(t, src, keyA)
	if _, err := ReadExport(ctx, bytes.NewReader(raw), dst, never, testHost, t.TempDir(), keyA, Limits{}); err != nil {
		t.Fatal(err)
	}
	scan := func() []spacestore.WakeRecord {
		recs, _, err := (&spacestore.WakeScanner{Bucket: dst}).Scan(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	if recs := scan(); len(recs) != 0 {
		t.Fatalf("the import recorded wakes: %+v", recs)
	}
	if err := restoreWake(ctx, dst, testHost); err != nil {
		t.Fatal(err)
	}
	if recs := scan(); len(recs) != 1 || recs[0].Host != testHost || !recs[0].At.Equal(at) {
		t.Fatalf("wake records in the destination: %+v, want %s at %v", recs, testHost, at)
	}
}
