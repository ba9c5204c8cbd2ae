package certstorage

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/certlock"
)

func newFileStorage(t *testing.T) (*Storage, bucket.Bucket) {
	t.Helper()
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return NewStorage(b, "certs", &certlock.Locker{Owner: "test", TTL: time.Minute}), b
}

func TestStorageSemantics(t *testing.T) {
	s, b := newFileStorage(t)
	ctx := context.Background()
	crt := "certificates/acme/wildcard_.mesh.test/wildcard_.mesh.test.crt"
	files := map[string]string{
		crt: "CERT",
		"certificates/acme/wildcard_.mesh.test/wildcard_.mesh.test.key":  "KEY",
		"certificates/acme/wildcard_.mesh.test/wildcard_.mesh.test.json": "{}",
		"acme/acme/users/ops/ops.json":                                   "user",
	}
	for k, v := range files {
		if err := s.Store(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	// Keys live under the certs/ sub-prefix of the bucket.
	if _, err := b.Head(ctx, "certs/"+crt); err != nil {
		t.Fatalf("certificate not under certs/: %v", err)
	}
	got, err := s.Load(ctx, crt)
	if err != nil || string(got) != "CERT" {
		t.Fatalf("Load = %q, %v", got, err)
	}
	if _, err := s.Load(ctx, "certificates/none.crt"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of a missing key = %v, want fs.ErrNotExist", err)
	}

	if !s.Exists(ctx, crt) || !s.Exists(ctx, "certificates/acme") || s.Exists(ctx, "certificates/other") || s.Exists(ctx, "certificates/ac") {
		t.Fatal("Exists wrong for a file, a directory, a missing key or a partial segment")
	}
	ki, err := s.Stat(ctx, crt)
	if err != nil || !ki.IsTerminal || ki.Size != 4 || ki.Key != crt || ki.Modified.IsZero() {
		t.Fatalf("Stat file = %+v, %v", ki, err)
	}
	ki, err = s.Stat(ctx, "certificates/acme")
	if err != nil || ki.IsTerminal {
		t.Fatalf("Stat directory = %+v, %v", ki, err)
	}
	if _, err := s.Stat(ctx, "nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Stat of a missing key = %v", err)
	}

	// A held lock must not show up as a storage key.
	if err := s.Lock(ctx, "issue_cert_*.mesh.test"); err != nil {
		t.Fatal(err)
	}
	top, err := s.List(ctx, "", false)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(top)
	if !slices.Equal(top, []string{"acme", "certificates"}) {
		t.Fatalf("List root = %v, want [acme certificates]", top)
	}
	dir := "certificates/acme/wildcard_.mesh.test"
	flat, err := s.List(ctx, "certificates", false)
	if err != nil || !slices.Equal(flat, []string{"certificates/acme"}) {
		t.Fatalf("List certificates = %v, %v", flat, err)
	}
	deep, err := s.List(ctx, "certificates", true)
	if err != nil || len(deep) != 3 || !strings.HasPrefix(deep[0], dir+"/") {
		t.Fatalf("List certificates recursive = %v, %v", deep, err)
	}
	if _, err := s.List(ctx, "nothing", true); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("List of a missing directory = %v", err)
	}

	// Deleting a directory deletes what is under it; a missing key is fine.
	if err := s.Delete(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if s.Exists(ctx, crt) || s.Exists(ctx, dir) || !s.Exists(ctx, "acme/acme/users/ops/ops.json") {
		t.Fatal("directory delete left its files, or removed others")
	}
	if err := s.Delete(ctx, "certificates/none"); err != nil {
		t.Fatalf("Delete of a missing key = %v", err)
	}
	if err := s.Unlock(ctx, "issue_cert_*.mesh.test"); err != nil {
		t.Fatal(err)
	}
}

// Storage's locks on the real file backend: two boxes' storages exclude each other,
// and a lock object lives at certs/locks/<name, path-escaped>, where operators and the
// fleet tests look for it.
func TestLocksOnFileBucket(t *testing.T) {
	s, b := newFileStorage(t)
	other := NewStorage(b, "certs", &certlock.Locker{Owner: "other", TTL: time.Minute})
	ctx := context.Background()
	const name = "issue_cert_*.mesh.test"
	if err := s.Lock(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Head(ctx, "certs/locks/issue_cert_%2A.mesh.test"); err != nil {
		t.Fatalf("the held lock is not at certs/locks/issue_cert_%%2A.mesh.test: %v", err)
	}
	if ok, err := other.TryLock(ctx, name); ok || err != nil {
		t.Fatalf("TryLock of a fresh held lock = %v, %v", ok, err)
	}
	if err := s.Unlock(ctx, name); err != nil {
		t.Fatal(err)
	}
	if ok, err := other.TryLock(ctx, name); !ok || err != nil {
		t.Fatalf("TryLock after release = %v, %v", ok, err)
	}
	if err := other.Unlock(ctx, name); err != nil {
		t.Fatal(err)
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input   string
		check   func(m *Module) bool
		wantErr string
	}{
		{input: "lchat {\n prefix tls\n lock_ttl 30s\n lock_refresh 5s\n lock_poll 250ms\n}", check: func(m *Module) bool {
			return m.Prefix == "tls" && m.LockTTL == caddy.Duration(30*time.Second) && m.LockRefresh == caddy.Duration(5*time.Second) && m.LockPoll == caddy.Duration(250*time.Millisecond)
		}},
		{input: "lchat extra", wantErr: "wrong argument count"},
		{input: "lchat {\n lock_ttl\n}", wantErr: "wrong argument count"},
		{input: "lchat {\n lock_ttl forever\n}", wantErr: "invalid lock_ttl"},
		{input: "lchat {\n bucket\n}", wantErr: "wrong argument count"},
		{input: "lchat {\n bucket nosuchbackend\n}", wantErr: "nosuchbackend"},
		{input: "lchat {\n locks 1\n}", wantErr: "unrecognized subdirective locks"},
	} {
		var m Module
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want %q", tc.input, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !tc.check(&m) {
			t.Errorf("%q: %v, got %+v", tc.input, err, m)
		}
	}
}

func TestValidate(t *testing.T) {
	m := Module{LockTTL: caddy.Duration(time.Minute), LockRefresh: caddy.Duration(time.Minute)}
	if err := m.Validate(); err == nil {
		t.Fatal("a refresh as long as the TTL was accepted")
	}
	m.LockRefresh = caddy.Duration(10 * time.Second)
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
}
