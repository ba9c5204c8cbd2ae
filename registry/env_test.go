package registry

import "testing"

// TestForbiddenEnv: the one deny list every path applies (admin create, replicated rows,
// the engine building an instance's environment).
func TestForbiddenEnv(t *testing.T) {
	for name, want := range map[string]bool{
		"ADMIN_TOKEN": false, "ENTITLEMENT": false, "seeded_name": false,
		"PATH": true, "path": true, "LD_PRELOAD": true, "ld_library_path": true, "DYLD_INSERT_LIBRARIES": true,
		"BASH_ENV": true, "BASH_FUNC_x%%": true, "NODE_OPTIONS": true, "MALLOC_CHECK_": true,
		"LCHAT_SOCKET": true, "LCHAT_MESH_TOKEN": true, "LCHAT_ANYTHING": true, "HOME": true,
		"": true, "A=B": true, "1ABC": true, "A-B": true, "A\x00B": true,
	} {
		if got := ForbiddenEnv(name); got != want {
			t.Errorf("ForbiddenEnv(%q) = %v, want %v", name, got, want)
		}
	}
}
