package console

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	var h Handler
	d := caddyfile.NewTestDispenser("lchat_console {\n actions\n sample_interval 5s\n page_size 20\n}")
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if !h.Actions || h.SampleInterval != caddy.Duration(5*time.Second) || h.PageSize != 20 {
		t.Fatalf("parsed %+v", h)
	}
	for in, want := range map[string]string{
		"lchat_console extra":                       "wrong argument count",
		"lchat_console {\n actions yes\n}":          "wrong argument count",
		"lchat_console {\n sample_interval\n}":      "wrong argument count",
		"lchat_console {\n sample_interval soon\n}": "sample_interval",
		"lchat_console {\n page_size 0\n}":          "positive",
		"lchat_console {\n page_size 1 2\n}":        "wrong argument count",
		"lchat_console {\n colour blue\n}":          "unrecognized subdirective colour",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
}
