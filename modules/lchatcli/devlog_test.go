package lchatcli

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/logging" // json and console, which dev's encoder wraps
	"go.uber.org/zap/zapcore"
)

// dev's encoder, as its config loads it, drops Caddy's exit message and keeps the rest,
// also once a logger's fields are added (a clone).
func TestDevLogsDropCaddysExitMessage(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, format := range []string{"json", "console"} {
		logs := DevLogs{"warn", format}.config()["logs"].(map[string]any)
		for _, name := range []string{"default", "admin"} {
			enc := maps.Clone(logs[name].(map[string]any)["encoder"].(map[string]any))
			id := "caddy.logging.encoders." + enc["format"].(string)
			delete(enc, "format")
			raw, _ := json.Marshal(enc)
			mod, err := ctx.LoadModuleByID(id, raw)
			if err != nil {
				t.Fatalf("%s log, %s: loading %s: %v", name, format, id, err)
			}
			e := mod.(zapcore.Encoder).Clone()
			e.AddString("signal", "SIGINT")
			for msg, kept := range map[string]bool{"exiting; byeee!! 👋": false, "wake failed": true} {
				buf, err := e.EncodeEntry(zapcore.Entry{Level: zapcore.WarnLevel, Message: msg}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.Contains(buf.String(), msg); got != kept {
					t.Errorf("%s log, %s: %q encodes to %q", name, format, msg, buf.String())
				}
			}
		}
	}
}
