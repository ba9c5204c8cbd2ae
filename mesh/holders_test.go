package mesh

import (
	"testing"
	"time"
)

func TestHolders(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	h := &Holders{TTL: 10 * time.Second, Now: func() time.Time { return now }}
	if _, ok := h.Get("a.test"); ok {
		t.Fatal("an empty cache knows a holder")
	}
	h.Put("a.test", "https://b.test")
	now = now.Add(9 * time.Second)
	if got, ok := h.Get("a.test"); !ok || got != "https://b.test" {
		t.Fatalf("Get = %q, %v", got, ok)
	}
	h.Put("a.test", "https://b.test") // confirmed by a response: fresh again
	now = now.Add(9 * time.Second)
	if _, ok := h.Get("a.test"); !ok {
		t.Fatal("a confirmed entry expired")
	}
	now = now.Add(time.Second)
	if _, ok := h.Get("a.test"); ok || h.Len() != 0 {
		t.Fatal("an unconfirmed entry outlived its TTL")
	}
	h.Put("a.test", "https://c.test")
	h.Forget("a.test")
	if _, ok := h.Get("a.test"); ok {
		t.Fatal("Forget kept the entry")
	}
}
