package connhold

import (
	"crypto/rand"
	"encoding/base64"
)

// NewID is a fresh connection id: 128 random bits, base64url without padding (22
// characters). Ids are unguessable, so knowing one is what lets a space address a
// connection; the control endpoint still refuses another space's ids.
func NewID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// validID reports whether id has the shape NewID gives.
func validID(id string) bool {
	if len(id) != 22 {
		return false
	}
	// Strict and 16 bytes: the decoder skips CR and LF, so "22 characters that decode"
	// alone would let a second spelling through.
	b, err := base64.RawURLEncoding.Strict().DecodeString(id)
	return err == nil && len(b) == 16
}

// ValidID reports whether id has the shape of a connection id (NewID).
func ValidID(id string) bool { return validID(id) }
