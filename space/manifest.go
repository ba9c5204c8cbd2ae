package space

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// File is one file of a space's data directory, by content hash.
type File struct {
	Path   string `json:"path"` // slash-separated, relative to the data directory
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // lowercase hex
	Mode   uint32 `json:"mode"`   // permission bits
}

// Manifest is the body of spaces/<host>/manifest: the space's current state.
type Manifest struct {
	Generation int64      `json:"generation"`
	Files      []File     `json:"files"`
	WrittenBy  string     `json:"written_by"`
	WrittenAt  time.Time  `json:"written_at"`
	NextWake   *time.Time `json:"next_wake,omitempty"`
}

// ErrFenced means the manifest's compare-and-swap failed: another writer owns the space now.
// The caller stops the instance at once and never retries the write.
var ErrFenced = errors.New("manifest changed by another writer: fenced out")

// ReadManifest reads a space's manifest and its ETag. A space that was never checkpointed has
// no manifest: (nil, "", nil).
func ReadManifest(ctx context.Context, b bucket.Bucket, host string) (*Manifest, string, error) {
	var m Manifest
	etag, err := getJSON(ctx, b, ManifestKey(host), &m)
	if errors.Is(err, bucket.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("reading manifest: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, "", err
	}
	return &m, etag, nil
}

// WriteManifest writes m with If-Match on prevETag, the last ETag this box saw (If-None-Match
// when prevETag is empty: the first manifest). A lost swap is ErrFenced.
func WriteManifest(ctx context.Context, b bucket.Bucket, host string, m *Manifest, prevETag string) (string, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	cond := bucket.Cond{IfMatch: prevETag}
	if prevETag == "" {
		cond = bucket.Cond{IfNoneMatch: true}
	}
	info, err := b.Put(ctx, ManifestKey(host), bytes.NewReader(body), int64(len(body)), cond)
	if errors.Is(err, bucket.ErrPreconditionFailed) || errors.Is(err, bucket.ErrConflict) {
		// The store may have applied this very write and lost its answer, and a retry
		// (the SDK's or ours) then fails its own condition: that is not another writer.
		if etag, ok := landed(ctx, b, ManifestKey(host), body); ok {
			return etag, nil
		}
		return "", ErrFenced
	}
	if err != nil {
		return "", fmt.Errorf("writing manifest: %w", err)
	}
	return info.ETag, nil
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(*b)
}
