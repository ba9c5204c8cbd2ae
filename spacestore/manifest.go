package spacestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

// File is one file of a space's data directory, by content hash.
type File struct {
	Path   string `json:"path"` // slash-separated, relative to the data directory
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // lowercase hex; empty for a SQLite image (format 2)
	Mode   uint32 `json:"mode"`   // permission bits
	// Content names the objects that hold the file (format 2). Nil in format 1: the file is
	// the one blob blobs/<SHA256>. A pointer keeps File comparable.
	Content *Content `json:"content,omitempty"`
}

// Content is where a format-2 file's bytes live: a plain file as content-defined chunks, a
// SQLite database as a page image (base chunks plus page deltas).
type Content struct {
	Chunks []Ref    `json:"chunks,omitempty"`
	DB     *DBImage `json:"db,omitempty"`
}

// Ref names one immutable object of a space. Key is relative to spaces/<host>/:
// "objs/<gen>/<sha256>" (format 2) or "blobs/<sha256>" (format 1, still referenced after
// migration until its file changes).
type Ref struct {
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// DBImage is a SQLite database as pages: Base holds raw page ranges of ChunkBytes bytes each
// (the last one shorter), taken at some generation; Deltas are LTX files applied in order on
// top. Checksum is the XOR of every page's hash (pageHash), over the final Pages pages.
type DBImage struct {
	PageSize   int     `json:"page_size"`
	Pages      uint32  `json:"pages"`
	Checksum   string  `json:"checksum"`
	ChunkBytes int64   `json:"chunk_bytes"`
	Base       []Ref   `json:"base"`
	Deltas     []Delta `json:"deltas,omitempty"`
}

// Delta is one LTX file of changed pages: a checkpoint's own changes (Level 0), or a merge of
// the newest deltas at Level-1 (Level 1, 2).
type Delta struct {
	Ref
	Level  int   `json:"level"`
	MinGen int64 `json:"min_gen"`
	MaxGen int64 `json:"max_gen"`
}

// Format is the manifest format this code writes. Format 1 (no "format" field) is a list of
// whole-file blobs; format 2 adds Content. A format-1 bucket is read as is and migrated by the
// first checkpoint; a format newer than Format is refused rather than misread.
const Format = 2

// Manifest is the body of spaces/<host>/manifest: the space's current state.
type Manifest struct {
	Format     int        `json:"format,omitempty"`
	Generation int64      `json:"generation"`
	Files      []File     `json:"files"`
	WrittenBy  string     `json:"written_by"`
	WrittenAt  time.Time  `json:"written_at"`
	NextWake   *time.Time `json:"next_wake,omitempty"`
	// RestoredFrom is the generation a point-in-time restore copied this state from.
	RestoredFrom int64 `json:"restored_from,omitempty"`
	// Claim is the lease of the holder that wrote this manifest: set by the fence write at
	// wake (claim.go) and carried by that holder's checkpoints. Absent in manifests written
	// before fencing at wake existed, or by restore and copy.
	Claim *Claim `json:"claim,omitempty"`
}

// Size is the total size of the space's files.
func (m *Manifest) Size() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Refs returns every object m references, each key relative to spaces/<host>/, without
// duplicates: what a copy of the space to another bucket must carry, and what GC must keep.
func (m *Manifest) Refs() []Ref {
	seen := make(map[string]bool)
	var out []Ref
	add := func(r Ref) {
		if !seen[r.Key] {
			seen[r.Key] = true
			out = append(out, r)
		}
	}
	for _, f := range m.Files {
		for _, r := range f.refs() {
			add(r)
		}
	}
	return out
}

// refs lists the objects holding f, in the order they are laid out.
func (f File) refs() []Ref {
	switch {
	case f.Content == nil:
		return []Ref{{Key: "blobs/" + f.SHA256, Size: f.Size, SHA256: f.SHA256}}
	case f.Content.DB != nil:
		out := slices.Clone(f.Content.DB.Base)
		for _, d := range f.Content.DB.Deltas {
			out = append(out, d.Ref)
		}
		return out
	default:
		return f.Content.Chunks
	}
}

// check refuses a manifest a newer version wrote, or one whose object keys or sizes could
// reach outside the space or fill the disk.
func (m *Manifest) check() error {
	if m.Format > Format {
		return fmt.Errorf("manifest format %d is newer than this binary's %d", m.Format, Format)
	}
	for _, f := range m.Files {
		if f.Size < 0 {
			return fmt.Errorf("manifest gives %q a negative size", f.Path)
		}
		if f.Content != nil && f.Content.DB != nil {
			d := f.Content.DB
			if !validPageSize(d.PageSize) || d.ChunkBytes <= 0 || d.ChunkBytes%int64(d.PageSize) != 0 ||
				int64(d.Pages)*int64(d.PageSize) != f.Size {
				return fmt.Errorf("manifest has an invalid page image for %q", f.Path)
			}
		}
		var total int64
		for _, r := range f.refs() {
			if !validRefKey(r.Key, r.SHA256) || r.Size < 0 {
				return fmt.Errorf("manifest names an invalid object %q for %q", r.Key, f.Path)
			}
			total += r.Size
		}
		if f.Content != nil && f.Content.DB == nil && total != f.Size {
			return fmt.Errorf("chunks of %q add up to %d bytes, manifest says %d", f.Path, total, f.Size)
		}
	}
	return nil
}

func validPageSize(n int) bool { return pageread.ValidPageSize(n) }

// validRefKey reports whether key is "blobs/<sum>" or "objs/<16 hex>/<sum>".
func validRefKey(key, sum string) bool {
	if len(sum) != 64 || strings.Trim(sum, "0123456789abcdef") != "" {
		return false
	}
	if key == "blobs/"+sum {
		return true
	}
	g, ok := strings.CutPrefix(key, "objs/")
	if !ok || len(g) != 16+1+64 || g[16] != '/' || g[17:] != sum {
		return false
	}
	_, err := strconv.ParseUint(g[:16], 16, 64)
	return err == nil
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
		return nil, "", fmt.Errorf("reading manifest: %w", err)
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
	if bucket.LostRace(err) {
		// The store may have applied this very write and lost its answer, and a retry
		// (the SDK's or ours) then fails its own condition: that is not another writer.
		if etag, _, ok := bucket.Landed(ctx, b, ManifestKey(host), body); ok {
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
