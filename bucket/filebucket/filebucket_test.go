package filebucket_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/buckettest"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

func TestConformance(t *testing.T) {
	buckettest.Run(t, func(t *testing.T) bucket.Bucket {
		b, err := filebucket.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

func TestConformanceWithPrefix(t *testing.T) {
	buckettest.Run(t, func(t *testing.T) bucket.Bucket {
		root, err := filebucket.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		// Another prefix's keys in the same root must stay invisible.
		other, err := root.Sub("other")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Put(t.Context(), "p/0001", strings.NewReader("x"), 1, bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
		b, err := root.Sub("/lchat/prod/")
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// TestOwnerOnly: nothing the bucket creates is readable or listable by other users,
// whatever the umask allows: objects hold spaces' data and certificate keys, and key
// names are the fleet's hosts. Parents the bucket creates for its root count too.
func TestOwnerOnly(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	top := t.TempDir()
	b, err := filebucket.New(filepath.Join(top, "data", "bucket"))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"spaces/a.example.com/manifest", "spaces/a.example.com/blobs/00ff", "certs/x/key"} {
		if _, err := b.Put(t.Context(), key, strings.NewReader("secret"), 6, bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Put(t.Context(), "spaces/a.example.com/lease", strings.NewReader("l"), 1, bucket.Cond{IfNoneMatch: true}); err != nil {
		t.Fatal(err)
	}
	n := 0
	err = filepath.WalkDir(filepath.Join(top, "data"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n++
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %v, want no group or other bits", p, fi.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("walked only %d paths", n)
	}
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestFailingConditionalPutCostsNoWrite: a conditional write whose precondition already
// fails is refused before its body is read (no temporary file, no sync: a wake's lease
// create on a released lease, or a swap that lost, costs no disk flush).
func TestFailingConditionalPutCostsNoWrite(t *testing.T) {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	info, err := b.Put(ctx, "k", strings.NewReader("v1"), 2, bucket.Cond{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cond := range []bucket.Cond{{IfNoneMatch: true}, {IfMatch: `"0123"`}} {
		body := &countingReader{r: strings.NewReader("v2")}
		if _, err := b.Put(ctx, "k", body, 2, cond); !errors.Is(err, bucket.ErrPreconditionFailed) {
			t.Fatalf("%+v: %v, want ErrPreconditionFailed", cond, err)
		}
		if body.n != 0 {
			t.Fatalf("%+v: the refused write read %d bytes of its body", cond, body.n)
		}
	}
	if _, err := b.Put(ctx, "k", strings.NewReader("v2"), 2, bucket.Cond{IfMatch: info.ETag}); err != nil {
		t.Fatalf("a swap that holds: %v", err)
	}
}
