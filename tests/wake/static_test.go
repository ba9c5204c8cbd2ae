package wake_test

import (
	"debug/elf"
	"testing"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestExecdHelpersAreStatic: the binaries a box execs at every wake (lchat-demo-space)
// and every checkpoint of an isolated space (lchat-pageread) are built without cgo
// (scripts/test, the harness, the docs' build commands). A dynamically linked one runs
// the dynamic loader and libc's start-up at each exec: about 1 ms of CPU per wake here
// (docs/wake-figures.md, "Built without cgo"), a fifth of a demo instance's share of a storm.
func TestExecdHelpersAreStatic(t *testing.T) {
	for name, path := range map[string]string{
		"lchat-demo-space": harness.DemoSpaceBinary(t),
		"lchat-pageread":   harness.PageReader(t),
	} {
		f, err := elf.Open(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s (%s) is dynamically linked (it has an ELF interpreter): build it with CGO_ENABLED=0", name, path)
			}
		}
		f.Close()
	}
}
