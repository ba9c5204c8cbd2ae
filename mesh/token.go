package mesh

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
)

// MinTokenLen is the shortest LCHAT_MESH_TOKEN a box accepts. The token is both the
// peers' bearer token and the key of the forwarding MAC, so it must not be guessable:
// 32 characters of mesh-token's alphabet carry 192 bits.
const MinTokenLen = 32

// CheckToken refuses a mesh token shorter than MinTokenLen. The error names the
// variable and the rule, never the value (nor its length).
func CheckToken(token string) error {
	if len(token) < MinTokenLen {
		return fmt.Errorf("%s is shorter than %d characters: it is the mesh's bearer token and MAC key; generate one with `lchat-caddy mesh-token` and set the same value on every box", EnvToken, MinTokenLen)
	}
	return nil
}

// NewToken returns a fresh random mesh token: 32 random bytes, base64url without
// padding (43 characters), safe in an env file without quoting.
func NewToken() string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand panics rather than return short)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
