package certs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/certlock"
	"github.com/lchat/lchat-caddy/modules/certstorage"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// caddy.storage.lchat's certmagic semantics on a real S3 (versitygw), where
// listings are paginated and missing keys are S3 errors: store, load, exists,
// stat, list (flat and recursive, across pages), directory delete, and locks that
// exclude another box's locker and are invisible as storage keys.
func TestStorageOnS3(t *testing.T) {
	s3 := harness.StartS3(t)
	ctx := context.Background()
	b := s3.NewBucket(t, "fleet")
	st := certstorage.NewStorage(b, "certs", &certlock.Locker{Owner: "box1", TTL: time.Minute})
	other := certstorage.NewStorage(s3.NewBucket(t, "fleet"), "certs", &certlock.Locker{Owner: "box2", TTL: time.Minute})

	// More keys than one S3 listing page (1000) under one directory.
	const n = 1005
	dir := "certificates/acme/wildcard_.mesh.test"
	for i := range n {
		if err := st.Store(ctx, fmt.Sprintf("%s/f%04d", dir, i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Store(ctx, "acme/acme/users/ops/ops.json", []byte(`{"user":1}`)); err != nil {
		t.Fatal(err)
	}
	if got, err := other.Load(ctx, "acme/acme/users/ops/ops.json"); err != nil || string(got) != `{"user":1}` {
		t.Fatalf("another box's Load = %q, %v", got, err)
	}
	if _, err := st.Load(ctx, "acme/none.json"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of a missing key = %v, want fs.ErrNotExist", err)
	}
	if _, err := b.Head(ctx, "certs/acme/acme/users/ops/ops.json"); err != nil {
		t.Fatalf("the value is not under certs/ in the bucket: %v", err)
	}

	if !st.Exists(ctx, dir+"/f0000") || !st.Exists(ctx, "certificates/acme") || st.Exists(ctx, "certificates/ac") || st.Exists(ctx, "nope") {
		t.Fatal("Exists wrong for a value, a directory, a partial segment or a missing key")
	}
	ki, err := st.Stat(ctx, dir+"/f0001")
	if err != nil || !ki.IsTerminal || ki.Size != 1 || ki.Modified.IsZero() {
		t.Fatalf("Stat of a value = %+v, %v", ki, err)
	}
	if ki, err := st.Stat(ctx, dir); err != nil || ki.IsTerminal {
		t.Fatalf("Stat of a directory = %+v, %v", ki, err)
	}
	if _, err := st.Stat(ctx, "nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Stat of a missing key = %v, want fs.ErrNotExist", err)
	}

	// A held lock: the other box cannot take it, and it is no storage key.
	if err := st.Lock(ctx, "issue_cert_*.mesh.test"); err != nil {
		t.Fatal(err)
	}
	if ok, err := other.TryLock(ctx, "issue_cert_*.mesh.test"); ok || err != nil {
		t.Fatalf("another box's TryLock of a held lock = %v, %v", ok, err)
	}
	top, err := st.List(ctx, "", false)
	slices.Sort(top)
	if err != nil || !slices.Equal(top, []string{"acme", "certificates"}) {
		t.Fatalf("List of the root = %v, %v; want [acme certificates]", top, err)
	}
	deep, err := st.List(ctx, "certificates", true)
	if err != nil || len(deep) != n {
		t.Fatalf("recursive List = %d keys, %v; want %d (listing pages followed)", len(deep), err, n)
	}
	flat, err := st.List(ctx, dir, false)
	if err != nil || len(flat) != n || flat[n-1] != fmt.Sprintf("%s/f%04d", dir, n-1) {
		t.Fatalf("flat List of the directory = %d keys, %v", len(flat), err)
	}

	if err := st.Delete(ctx, "certificates"); err != nil {
		t.Fatal(err)
	}
	if st.Exists(ctx, dir+"/f1004") || st.Exists(ctx, "certificates") || !st.Exists(ctx, "acme/acme/users/ops/ops.json") {
		t.Fatal("directory delete left keys under it, or removed others")
	}
	if err := st.Delete(ctx, "certificates/none"); err != nil {
		t.Fatalf("Delete of a missing key = %v", err)
	}

	if err := st.Unlock(ctx, "issue_cert_*.mesh.test"); err != nil {
		t.Fatal(err)
	}
	if ok, err := other.TryLock(ctx, "issue_cert_*.mesh.test"); !ok || err != nil {
		t.Fatalf("another box's TryLock after the release = %v, %v", ok, err)
	}
	if err := other.Unlock(ctx, "issue_cert_*.mesh.test"); err != nil {
		t.Fatal(err)
	}
}
