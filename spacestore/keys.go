// Package spacestore is the bucket side of a hibernating space: the lease that says who may
// write it, the manifest that names its current state, the content-addressed blobs that hold
// its files, consistent snapshots and restores of its data directory, and scheduled-wake
// records.
//
// Layout (keys relative to the bucket's prefix):
//
//	spaces/<host>/lease          who may write this space
//	spaces/<host>/manifest       generation + file list with content hashes (CAS-written)
//	spaces/<host>/blobs/<sha256> file contents (format 1)
//	spaces/<host>/objs/<gen>/<sha256> chunks, page images and page deltas (format 2), under
//	                             the generation that first wrote them
//	spaces/<host>/history/<gen>.<unix ms>.<bytes>  the manifest of each checkpoint
//	spaces/<host>/log/<gen>/<seq>  log segments extending manifest generation gen (log.go)
//	wakes/<host>                 next due scheduled wake (RFC 3339)
package spacestore

import (
	"fmt"
	"time"
)

// LeaseKey is the key of a space's lease.
func LeaseKey(host string) string { return "spaces/" + host + "/lease" }

// ManifestKey is the key of a space's manifest.
func ManifestKey(host string) string { return "spaces/" + host + "/manifest" }

// BlobKey is the key of one content-addressed blob of a space.
func BlobKey(host, sum string) string { return "spaces/" + host + "/blobs/" + sum }

// WakesPrefix is the prefix listed once per scan for scheduled wakes.
const WakesPrefix = "wakes/"

// WakeKey is the key of a space's scheduled-wake record.
func WakeKey(host string) string { return WakesPrefix + host }

// ObjectKey is the key of a format-2 object first written for generation gen.
func ObjectKey(host string, gen int64, sum string) string {
	return "spaces/" + host + "/" + objRel(gen, sum)
}

func objRel(gen int64, sum string) string { return fmt.Sprintf("objs/%016x/%s", gen, sum) }

// RefKey is the bucket key of a manifest's object reference.
func RefKey(host string, r Ref) string { return "spaces/" + host + "/" + r.Key }

// HistoryPrefix is listed to find a space's checkpoints.
func HistoryPrefix(host string) string { return "spaces/" + host + "/history/" }

// HistoryKey is the key of the copy of generation gen's manifest, written at at with size
// bytes of files: a listing alone is enough to show the history.
func HistoryKey(host string, gen int64, at time.Time, size int64) string {
	return fmt.Sprintf("%s%016x.%d.%d", HistoryPrefix(host), gen, at.UnixMilli(), size)
}
