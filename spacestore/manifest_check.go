package spacestore

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
)

// DecodeManifest decodes a manifest's body and checks it (Validate): a manifest that
// decodes but names a path outside the data dir, a malformed hash or a negative size is
// refused before anything is downloaded or written.
func DecodeManifest(data []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("decoding manifest: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate checks what a restore relies on: the objects and sizes check() accepts; every
// path is a clean relative path inside the data dir (fs.ValidPath, not "."), named once,
// and never both a file and a parent directory of another file; a format-1 file's hash is
// 64 lowercase hex digits (it names its blob's key); the generation is not negative.
func (m *Manifest) Validate() error {
	if err := m.check(); err != nil {
		return err
	}
	if m.Generation < 0 {
		return fmt.Errorf("manifest: negative generation %d", m.Generation)
	}
	paths := make(map[string]bool, len(m.Files))
	for _, f := range m.Files {
		if !fs.ValidPath(f.Path) || f.Path == "." {
			return fmt.Errorf("manifest names an invalid path %q", f.Path)
		}
		if paths[f.Path] {
			return fmt.Errorf("manifest names %q twice", f.Path)
		}
		paths[f.Path] = true
		if f.Size < 0 {
			return fmt.Errorf("manifest: %q has a negative size", f.Path)
		}
		if f.Content == nil && !validSHA256(f.SHA256) || f.SHA256 != "" && !validSHA256(f.SHA256) {
			return fmt.Errorf("manifest: %q has an invalid sha256 %q", f.Path, f.SHA256)
		}
	}
	for p := range paths {
		for dir := p; ; {
			i := strings.LastIndexByte(dir, '/')
			if i < 0 {
				break
			}
			dir = dir[:i]
			if paths[dir] {
				return fmt.Errorf("manifest names %q both as a file and as a directory", dir)
			}
		}
	}
	return nil
}

func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
