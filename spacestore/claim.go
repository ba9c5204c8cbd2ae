package spacestore

import (
	"context"
	"time"
)

// A lease alone does not stop an older holder's writes. A holder paused (SIGSTOP, a stalled
// machine) with a checkpoint in flight resumes and completes its manifest swap against the
// ETag it last wrote; if the new holder restored that same manifest and has not written one
// yet, the old write lands, and the new holder's first checkpoint then fails its swap: every
// write its instance acknowledged is gone. So a new holder fences before its instance may
// acknowledge anything: it rewrites the manifest it restored, conditioned on the ETag it read
// and stamped with its lease (Fence). Every pending swap of an older holder is conditioned on
// an ETag that is no longer current and fails; every later swap of this holder is conditioned
// on the stamped one. This is the fencing token of Kleppmann's "How to do distributed
// locking", with the manifest's ETag as the token the store checks.

// Claim stamps a manifest with the lease it was written under.
type Claim struct {
	Holder      string `json:"holder"`
	Incarnation string `json:"incarnation"`
	// Lease is the lease's ETag when this holder took it: unique per acquisition, so the
	// holder recognizes its own fence write when the store's answer is lost (ambiguous.go).
	Lease string    `json:"lease"`
	At    time.Time `json:"at"`
}

// Fence rewrites the manifest this syncer loaded (the same generation and files; an empty
// generation-0 manifest for a space never checkpointed) stamped with c, conditioned on the
// loaded ETag: from then on no earlier holder's pending manifest write can land. Its later
// checkpoints carry c. ErrFenced means the manifest changed since Load (an earlier holder's
// late write landed first, or another box took the space): Load and restore again before
// fencing again. It costs one conditional PUT.
func (s *Syncer) Fence(ctx context.Context, c Claim) error {
	m := &Manifest{}
	if s.manifest != nil {
		cp := *s.manifest // Files is shared, never mutated
		m = &cp
	} else if !s.FullFile {
		m.Format = Format
	}
	c.At = c.At.UTC()
	m.Claim = &c
	etag, err := s.writeManifest(ctx, m)
	if err != nil {
		return err
	}
	s.manifest, s.etag, s.claim = m, etag, &c
	return nil
}
