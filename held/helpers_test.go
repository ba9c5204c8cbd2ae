package held

import (
	"os"
	"testing"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
)

// TestMain doubles as an instance (boxtest.RunInstance) for the boxes the tests open
// with boxtest.InstanceKinds (boxtest.MeshBox).
func TestMain(m *testing.M) {
	boxtest.RunInstance()
	os.Exit(m.Run())
}

// openConns holds connections for b (New), closed and finished before b when the test
// ends.
func openConns(t *testing.T, b *box.Box) *Conns {
	t.Helper()
	c, err := New(Config{Box: b, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		c.Finish()
	})
	return c
}
