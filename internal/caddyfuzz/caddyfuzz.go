// Package caddyfuzz is the one helper every module's Caddyfile fuzz target shares: it
// tokenizes arbitrary input (caddyfile.NewTestDispenser exits the process on a lexer
// error, so it cannot take fuzz input), runs a module's UnmarshalCaddyfile and checks
// that what it accepted survives the JSON round trip Caddy makes of every config.
package caddyfuzz

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Seeds are inputs worth adding to every Caddyfile fuzz target besides its own examples:
// empty blocks, unbalanced braces, stray arguments, placeholders and odd quoting.
var Seeds = []string{
	"", "{", "}", "x {", "x {\n}", "x {\n\ty\n}", "x a b c", "x {\n\ty {\n\t\tz\n\t}\n}",
	"x {env.A}", "x `a b`", "x \"a\\\"b\"", "x {\n\t\n\t\n}", "x {\n\tz 1 2 3 4\n}",
}

// Unmarshal tokenizes input and runs newModule().UnmarshalCaddyfile on it. It reports
// whether the input was accepted; an accepted module must marshal to JSON, decode back
// into a fresh module and marshal to the same JSON again.
func Unmarshal[T caddyfile.Unmarshaler](t *testing.T, input string, newModule func() T) (T, bool) {
	t.Helper()
	m := newModule()
	tokens, err := caddyfile.Tokenize([]byte(input), "Fuzzfile")
	if err != nil || len(tokens) == 0 {
		return m, false
	}
	if err := m.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
		return m, false
	}
	first, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("accepted %q but its config does not marshal: %v", input, err)
	}
	again := newModule()
	if err := json.Unmarshal(first, again); err != nil {
		t.Fatalf("accepted %q but its JSON %s does not decode: %v", input, first, err)
	}
	second, err := json.Marshal(again)
	if err != nil || !bytes.Equal(first, second) {
		t.Fatalf("accepted %q: JSON changes on a round trip:\n%s\n%s", input, first, second)
	}
	return m, true
}
