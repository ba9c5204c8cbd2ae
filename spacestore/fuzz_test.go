package spacestore

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

// FuzzOpenView feeds arbitrary database and WAL bytes to the page reader: the instance
// writes both files, so no content may crash the box or make it allocate for data it lacks.
func FuzzOpenView(f *testing.F) {
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed.db")
	db := openDB(&testing.T{}, seed)
	db.Exec("CREATE TABLE t (x)")
	db.Exec("INSERT INTO t VALUES (randomblob(5000))")
	main, _ := os.ReadFile(seed)
	wal, _ := os.ReadFile(seed + "-wal")
	db.Close()
	f.Add(main, wal)
	f.Add(main, []byte{})
	f.Fuzz(func(t *testing.T, main, wal []byte) {
		d := t.TempDir()
		p := filepath.Join(d, "x.db")
		os.WriteFile(p, main, 0o600)
		if len(wal) > 0 {
			os.WriteFile(p+"-wal", wal, 0o600)
		}
		v, err := pageread.Open(context.Background(), p, nil)
		if err != nil {
			return
		}
		defer v.Close()
		v.Scan(func(uint32, []byte) error { return nil })
	})
}

// FuzzManifest: a manifest (or history entry) read from the bucket is either refused or safe
// to restore from: its object keys stay inside the space.
func FuzzManifest(f *testing.F) {
	f.Add([]byte(`{"format":2,"generation":3,"files":[{"path":"a.db","size":8192,"content":{"db":{"page_size":4096,"pages":2,"checksum":"1","chunk_bytes":2097152,"base":[{"key":"objs/0000000000000001/` + sha64 + `","size":8192,"sha256":"` + sha64 + `"}]}}}]}`))
	f.Add([]byte(`{"generation":1,"files":[{"path":"f","size":1,"sha256":"` + sha64 + `"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var m Manifest
		if json.Unmarshal(data, &m) != nil || m.check() != nil {
			return
		}
		for _, r := range m.Refs() {
			if !validRefKey(r.Key, r.SHA256) {
				t.Fatalf("check passed a bad key %q", r.Key)
			}
		}
	})
}

// FuzzHistoryNames: listing names and --at values never crash the parsers.
func FuzzHistoryNames(f *testing.F) {
	f.Add("0000000000000003.1764547200000.4096", "2026-12-01T00:00:00Z")
	f.Add("x", "12")
	f.Fuzz(func(t *testing.T, name, at string) {
		if cp, ok := parseHistoryKey(name); ok && cp.Generation <= 0 {
			t.Fatalf("parsed generation %d", cp.Generation)
		}
		if tg, err := ParseTarget(at); err == nil && tg.Generation < 0 {
			t.Fatalf("parsed generation %d", tg.Generation)
		}
	})
}

const sha64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
