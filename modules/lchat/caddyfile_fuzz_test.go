package lchat

import (
	"testing"

	"github.com/lchat/lchat-caddy/internal/caddyfuzz"
)

func FuzzAppCaddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds,
		"lchat {\n\tbucket file /tmp/b\n\tstate_dir /s\n\tregistry /r.db\n\tmax_awake 2\n\tdrain_timeout 30s\n\tkind demo {\n\t\tcommand {self} demo-space\n\t\tready_path /healthz\n\t\tidle_timeout 10m\n\t\tstop_grace 10s\n\t\tstop_signal SIGTERM\n\t\treplication periodic 60s\n\t\tallowed_env A B\n\t}\n}",
		"lchat {\n\tmesh {\n\t\tself https://a.example.net\n\t\tdomains example.com\n\t}\n\twildcard_domains example.com example.net\n}",
		"lchat {\n\tkind k {\n\t\treplication hourly\n\t}\n}",
		"lchat {\n\tkind k {\n\t\tnetwork egress {\n\t\t\tallow 10.1.0.0/16 fd12::7\n\t\t}\n\t}\n\tkind n {\n\t\tnetwork none\n\t}\n}", "lchat {\n\tmax_awake -1\n}", "lchat {\n\tkind {\n\t}\n}",
	) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *App { return new(App) })
	})
}

func FuzzHandlerCaddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds, "lchat", "lchat {\n\tflush_interval -1\n\tretry_after 5s\n}", "lchat x") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *Handler { return new(Handler) })
	})
}

func FuzzMeshAPICaddyfile(f *testing.F) {
	for _, s := range append(caddyfuzz.Seeds, "lchat_mesh_api", "lchat_mesh_api {\n\tmax_row_bytes 1024\n}", "lchat_mesh_api x") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		caddyfuzz.Unmarshal(t, input, func() *MeshAPI { return new(MeshAPI) })
	})
}
