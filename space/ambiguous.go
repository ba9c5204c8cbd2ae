package space

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"

	"github.com/lchat/lchat-caddy/bucket"
)

// A conditional write can be applied by the store and its answer lost (a timeout after the
// commit, a cut connection). Retried with the same condition it then fails, which read
// naively says "another writer won" -- for the manifest, a fence that kills a healthy
// instance. Every write this package conditions carries something unique to it (the
// manifest's written_at and generation, the lease's acquired_at), so the writer can
// recognize its own bytes in the object and know the write landed.

// landed reports whether key now holds exactly body, and its ETag: the write of body
// landed, whatever answer the writer saw.
func landed(ctx context.Context, b bucket.Bucket, key string, body []byte) (string, bool) {
	obj, err := b.Get(ctx, key)
	if err != nil {
		return "", false
	}
	defer obj.Body.Close()
	cur, err := io.ReadAll(io.LimitReader(obj.Body, int64(len(body))+1))
	if err != nil || !bytes.Equal(cur, body) {
		return "", false
	}
	return obj.ETag, true
}

// writeManifest writes m over the manifest this syncer last saw. When the swap fails
// because an earlier write of this syncer whose answer was lost did land, that write is
// adopted as the current manifest and m is written over it, one generation later.
func (s *Syncer) writeManifest(ctx context.Context, m *Manifest) (string, error) {
	etag, err := WriteManifest(ctx, s.Bucket, s.Host, m, s.etag)
	if errors.Is(err, ErrFenced) && s.unsure != nil {
		if cur, ok := landed(ctx, s.Bucket, ManifestKey(s.Host), s.unsure); ok {
			var prev Manifest
			if json.Unmarshal(s.unsure, &prev) == nil {
				s.manifest, s.etag, s.unsure = &prev, cur, nil
				m.Generation = prev.Generation + 1
				etag, err = WriteManifest(ctx, s.Bucket, s.Host, m, s.etag)
			}
		}
	}
	switch {
	case err == nil:
		s.unsure = nil
	case !errors.Is(err, ErrFenced):
		s.unsure, _ = json.Marshal(m) // the same bytes WriteManifest sent
	}
	return etag, err
}
