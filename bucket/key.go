package bucket

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidKey means a key or prefix is not usable: empty, absolute, with an empty,
// "." or ".." segment, or with a NUL byte. Backends wrap it, so test with errors.Is.
var ErrInvalidKey = errors.New("invalid key")

// CheckKey reports whether key is a valid object key. Keys are slash-separated paths
// relative to the backend's prefix; the same rules hold for every backend, so a key
// that works against a local directory also works against S3 and the other way round.
func CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	return checkPath(key, false)
}

// CheckPrefix reports whether prefix is a valid listing prefix. The empty prefix lists
// everything; a prefix may end in "/" or in a partial segment ("spaces/ab").
func CheckPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return checkPath(prefix, true)
}

func checkPath(p string, isPrefix bool) error {
	if strings.HasPrefix(p, "/") {
		return fmt.Errorf("%w: %q is absolute", ErrInvalidKey, p)
	}
	if strings.ContainsRune(p, 0) {
		return fmt.Errorf("%w: %q contains a NUL byte", ErrInvalidKey, p)
	}
	segs := strings.Split(p, "/")
	for i, s := range segs {
		last := i == len(segs)-1
		switch {
		case s == "" && !(isPrefix && last):
			return fmt.Errorf("%w: %q has an empty segment", ErrInvalidKey, p)
		case s == "..":
			return fmt.Errorf("%w: %q has a \"..\" segment", ErrInvalidKey, p)
		case s == "." && !(isPrefix && last):
			return fmt.Errorf("%w: %q has a \".\" segment", ErrInvalidKey, p)
		}
	}
	return nil
}

// JoinPrefix joins a backend prefix and a key with one slash. A prefix is stored
// without leading or trailing slashes; the empty prefix leaves key unchanged.
func JoinPrefix(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "/" + key
}

// CleanPrefix normalizes a configured backend prefix: surrounding slashes are dropped,
// and the rest must be a valid key ("" is allowed).
func CleanPrefix(prefix string) (string, error) {
	p := strings.Trim(prefix, "/")
	if p == "" {
		return "", nil
	}
	if err := CheckKey(p); err != nil {
		return "", fmt.Errorf("prefix: %w", err)
	}
	return p, nil
}
