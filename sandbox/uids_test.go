package sandbox

import (
	"path/filepath"
	"testing"
)

func TestUIDsStableCollisionsPersisted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uids.json")
	u, err := OpenUIDs(path, 5000, 4)
	if err != nil {
		t.Fatal(err)
	}
	u.taken = func(id uint32) bool { return id == 5002 }
	got := map[uint32]string{}
	for _, h := range []string{"a.example", "b.example", "c.example"} {
		id, err := u.For(h)
		if err != nil {
			t.Fatal(err)
		}
		if id < 5000 || id >= 5004 || id == 5002 {
			t.Fatalf("%s got %d: outside the range or an existing account", h, id)
		}
		if prev, dup := got[id]; dup {
			t.Fatalf("%s and %s share uid %d", h, prev, id)
		}
		got[id] = h
		again, _ := u.For(h)
		if again != id {
			t.Fatalf("%s: %d then %d", h, id, again)
		}
	}
	if _, err := u.For("d.example"); err == nil {
		t.Fatal("a fourth host fit in a range of four with one uid taken by an account")
	}
	// A restart keeps every host's uid.
	u2, err := OpenUIDs(path, 5000, 4)
	if err != nil {
		t.Fatal(err)
	}
	u2.taken = u.taken
	for id, h := range got {
		if again, err := u2.For(h); err != nil || again != id {
			t.Fatalf("after reopening, %s got %d (%v), had %d", h, again, err, id)
		}
	}
}

func TestUIDsRefusesRangeWithRoot(t *testing.T) {
	if _, err := OpenUIDs(filepath.Join(t.TempDir(), "u"), 0, 10); err == nil {
		t.Fatal("a range starting at uid 0 was accepted")
	}
}
