package spacestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/restic/chunker"
)

// uploadConcurrency bounds the PUTs of one checkpoint in flight (and the memory they hold).
const uploadConcurrency = 4

// uploader puts a checkpoint's new objects, content-addressed under the generation being
// written. An object the base manifest already references is reused, never one merely found
// in the bucket: GC may be about to delete an unreferenced object, but never a referenced one.
type uploader struct {
	b     bucket.Bucket
	host  string
	reuse map[string]Ref // by SHA-256: every object of the manifest this checkpoint builds on

	sem chan struct{}
	wg  sync.WaitGroup

	mu      sync.Mutex
	done    map[string]Ref // guarded by mu
	err     error          // guarded by mu; the first failed PUT
	objects int            // guarded by mu
	bytes   int64          // guarded by mu
}

func newUploader(b bucket.Bucket, host string, base *Manifest) *uploader {
	u := &uploader{b: b, host: host, reuse: make(map[string]Ref), done: make(map[string]Ref),
		sem: make(chan struct{}, uploadConcurrency)}
	if base != nil {
		for _, r := range base.Refs() {
			u.reuse[r.SHA256] = r
		}
	}
	return u
}

// put stores data (which the caller must not modify afterwards) unless an identical object is
// referenced already, and returns its reference. The PUT may still be running: wait reports it.
func (u *uploader) put(ctx context.Context, gen int64, data []byte) (Ref, error) {
	sum := sha256Hex(data)
	if r, ok := u.reuse[sum]; ok && r.Size == int64(len(data)) {
		return r, nil
	}
	u.mu.Lock()
	if r, ok := u.done[sum]; ok {
		u.mu.Unlock()
		return r, nil
	}
	ref := Ref{Key: objRel(gen, sum), Size: int64(len(data)), SHA256: sum}
	u.done[sum] = ref
	err := u.err
	u.mu.Unlock()
	if err != nil {
		return Ref{}, err
	}
	select {
	case u.sem <- struct{}{}:
	case <-ctx.Done():
		return Ref{}, ctx.Err()
	}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		defer func() { <-u.sem }()
		_, err := u.b.Put(ctx, RefKey(u.host, ref), bytes.NewReader(data), ref.Size, bucket.Cond{IfNoneMatch: true})
		if bucket.LostRace(err) {
			err = nil // content-addressed: the same bytes are there already
		}
		u.mu.Lock()
		defer u.mu.Unlock()
		if err != nil {
			if u.err == nil {
				u.err = fmt.Errorf("uploading %s: %w", ref.Key, err)
			}
			return
		}
		u.objects++
		u.bytes += ref.Size
	}()
	return ref, nil
}

// wait waits for every PUT and returns the first error.
func (u *uploader) wait() error {
	u.wg.Wait()
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.err
}

// Content-defined chunking of plain files: boundaries follow the content, so an insertion
// early in a large file changes a chunk or two, not every fixed-size block after it.
const (
	cdcMin         = 128 << 10
	cdcMax         = 2 << 20
	cdcAverageBits = 19 // 512 KiB on average
	// cdcPol is the fixed irreducible polynomial of every space's chunker: the same content
	// must split the same way at every checkpoint.
	cdcPol = chunker.Pol(0x3DA3358B4DC173)
)

// chunkFile reads the plain file at p once, splitting it into content-defined chunks that it
// uploads (unless referenced already) while hashing the whole file.
func (s *Syncer) chunkFile(ctx context.Context, p string, gen int64, up *uploader) (File, error) {
	in, err := os.Open(p)
	if err != nil {
		return File{}, err
	}
	defer in.Close()
	h := sha256.New()
	ch := chunker.NewWithBoundaries(io.TeeReader(in, h), cdcPol, cdcMin, cdcMax)
	ch.SetAverageBits(cdcAverageBits)
	buf := make([]byte, cdcMax)
	f := File{Content: &Content{}}
	for {
		if err := ctx.Err(); err != nil {
			return File{}, err
		}
		c, err := ch.Next(buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			return File{}, err
		}
		ref, err := up.put(ctx, gen, bytes.Clone(c.Data))
		if err != nil {
			return File{}, err
		}
		f.Content.Chunks = append(f.Content.Chunks, ref)
		f.Size += int64(c.Length)
	}
	f.SHA256 = hex.EncodeToString(h.Sum(nil))
	return f, nil
}
