package spacestore

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
)

// trickle returns at most step bytes per Read, as a socket does.
type trickle struct {
	r    io.Reader
	step int
}

func (t *trickle) Read(p []byte) (int, error) { return t.r.Read(p[:min(len(p), t.step)]) }

type recWriter struct {
	bytes.Buffer
	writes []int
}

func (w *recWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, len(p))
	return w.Buffer.Write(p)
}

// A restore writes an object in whole buffers, not in whatever each socket read returned:
// fewer writes (which take turns on the file's inode lock) and base chunks hashed in whole
// pages in place, never copied into a partial-page buffer.
func TestCopyFullWritesWholeBuffers(t *testing.T) {
	data := make([]byte, 3*fetchBuffer+12345)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	var w recWriter
	n, err := copyFull(&w, &trickle{r: bytes.NewReader(data), step: 1000}, make([]byte, fetchBuffer))
	if err != nil || n != int64(len(data)) || !bytes.Equal(w.Bytes(), data) {
		t.Fatalf("copied %d bytes, err %v, same content %v", n, err, bytes.Equal(w.Bytes(), data))
	}
	want := []int{fetchBuffer, fetchBuffer, fetchBuffer, 12345}
	if len(w.writes) != len(want) {
		t.Fatalf("writes %v, want %v", w.writes, want)
	}
	for i := range want {
		if w.writes[i] != want[i] {
			t.Fatalf("writes %v, want %v", w.writes, want)
		}
	}
	// A page hasher fed this way never buffers a partial page.
	h := &pageHasher{hashes: make([]uint64, len(data)/4096), pageSize: 4096, next: 1}
	if _, err := copyFull(io.MultiWriter(io.Discard, h), &trickle{r: bytes.NewReader(data[:3*fetchBuffer]), step: 1000}, make([]byte, fetchBuffer)); err != nil {
		t.Fatal(err)
	}
	if cap(h.buf) != 0 || h.hashes[0] != pageHash(1, data[:4096]) {
		t.Fatalf("page hasher buffered a partial page (cap %d) or hashed wrong", cap(h.buf))
	}
}

// A wake's downloads reuse their buffers: fetching many small objects (a delta chain)
// does not allocate a fresh megabyte for each.
func TestFetchReusesBuffers(t *testing.T) {
	if raceOn {
		t.Skip("under -race a sync.Pool drops what is put back at random")
	}
	ctx := context.Background()
	b := backends["file"](t)
	s := &Syncer{Bucket: b, Host: "buf.example.com"}
	data := bytes.Repeat([]byte("delta"), 1000)
	ref := Ref{Key: "blobs/x", Size: int64(len(data)), SHA256: sha256Hex(data)}
	if _, err := b.Put(ctx, RefKey(s.Host, ref), bytes.NewReader(data), ref.Size, bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	fetch := func() {
		j := &fetch{ref: ref}
		if err := s.fetchOne(ctx, j); err != nil || !bytes.Equal(j.mem, data) {
			t.Fatalf("fetch: %v", err)
		}
	}
	fetch()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 20
	for range n {
		fetch()
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per > fetchBuffer/2 {
		t.Fatalf("each fetch of a %d-byte object allocated %d bytes", len(data), per)
	}
}
