package spacestore

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/lchat/lchat-caddy/bucket"
)

// A conditional write can be applied by the store and its answer lost (bucket.Landed).
// Every write this package conditions carries something unique to it (the manifest's
// written_at and generation, the lease's acquired_at), so its bytes identify it.

// writeManifest writes m over the manifest this syncer last saw. When the swap fails
// because an earlier write of this syncer whose answer was lost did land, that write is
// adopted as the current manifest and m is written over it, one generation later.
func (s *Syncer) writeManifest(ctx context.Context, m *Manifest) (string, error) {
	etag, err := WriteManifest(ctx, s.Bucket, s.Host, m, s.etag)
	if errors.Is(err, ErrFenced) && s.unsure != nil {
		if cur, _, ok := bucket.Landed(ctx, s.Bucket, ManifestKey(s.Host), s.unsure); ok {
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
