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

// Settle settles an unsure manifest write (Unsure) without writing: the manifest is read;
// holding that write's bytes, it is adopted (adopted: the generation moved on, as after a
// checkpoint); holding the manifest this syncer last saw, the write did not land. Another
// writer's manifest is ErrFenced. Nothing to settle is nil.
func (s *Syncer) Settle(ctx context.Context) (adopted bool, err error) {
	if s.unsure == nil {
		return false, nil
	}
	if cur, _, ok := bucket.Landed(ctx, s.Bucket, ManifestKey(s.Host), s.unsure); ok {
		var m Manifest
		if err := json.Unmarshal(s.unsure, &m); err != nil {
			return false, err
		}
		s.manifest, s.etag, s.unsure = &m, cur, nil
		return true, nil
	}
	_, etag, err := ReadManifest(ctx, s.Bucket, s.Host)
	if err != nil {
		return false, err
	}
	if etag != s.etag {
		return false, ErrFenced
	}
	s.unsure = nil
	return false, nil
}
