//go:build !linux

package spacestore

import "os"

// allocate sizes a file a restore is about to fill to size bytes (alloc_linux.go
// allocates its blocks as well).
func allocate(f *os.File, size int64) error { return f.Truncate(size) }
