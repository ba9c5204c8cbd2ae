package mesh

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
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

// parseAccept reads LCHAT_MESH_TOKEN_ACCEPT: tokens separated by commas or spaces, each as
// long as CheckToken asks. The box's own token is dropped from the list (it is accepted
// anyway). Errors name the variable and the position, never a value.
func parseAccept(raw string, own Secret) ([]Secret, error) {
	var out []Secret
	for i, f := range strings.FieldsFunc(raw, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
		if len(f) < MinTokenLen {
			return nil, fmt.Errorf("%s: token %d is shorter than %d characters: generate tokens with `lchat-caddy mesh-token`", EnvTokenAccept, i+1, MinTokenLen)
		}
		if Secret(f) != own {
			out = append(out, Secret(f))
		}
	}
	return out, nil
}

// NewToken returns a fresh random mesh token: 32 random bytes, base64url without
// padding (43 characters), safe in an env file without quoting.
func NewToken() string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand panics rather than return short)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
