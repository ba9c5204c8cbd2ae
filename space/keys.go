// Package space is the bucket side of a hibernating space: the lease that says who may write it,
// the manifest that names its current state, the content-addressed blobs that hold its files,
// consistent snapshots and restores of its data directory, and scheduled-wake records.
//
// Layout (keys relative to the bucket's prefix):
//
//	spaces/<host>/lease          who may write this space
//	spaces/<host>/manifest       generation + file list with content hashes (CAS-written)
//	spaces/<host>/blobs/<sha256> file contents
//	wakes/<host>                 next due scheduled wake (RFC 3339)
package space

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
