package mesh

import (
	"strings"
	"testing"
)

func TestShortMeshTokenRefusedWithoutItsValue(t *testing.T) {
	short := "tiny-secret-value-31-characters"[:31]
	_, err := ParseEnv(envOf(map[string]string{EnvSelf: "https://a.example.net", EnvDomains: "example.com", EnvToken: short}))
	if err == nil {
		t.Fatal("a 31-character mesh token was accepted")
	}
	if !strings.Contains(err.Error(), EnvToken) || strings.Contains(err.Error(), short) || strings.Contains(err.Error(), "31") {
		t.Fatalf("error %q: want the variable named, never the value or its length", err)
	}
	if _, err := ParseEnv(envOf(map[string]string{EnvSelf: "https://a.example.net", EnvDomains: "example.com", EnvToken: NewToken()})); err != nil {
		t.Fatalf("a fresh mesh-token was refused: %v", err)
	}
}

func TestNewTokenIsLongAndFresh(t *testing.T) {
	a, b := NewToken(), NewToken()
	if len(a) < MinTokenLen || a == b || strings.ContainsAny(a, "+/= \n") {
		t.Fatalf("tokens %q %q: want two different env-safe tokens of at least %d characters", a, b, MinTokenLen)
	}
}
