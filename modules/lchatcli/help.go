package lchatcli

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/internal/buildinfo"
	"github.com/lchat/lchat-caddy/internal/cli"
)

func init() {
	// `lchat-caddy version` (Caddy's command, and the root's --version) prints Caddy's
	// version after CustomVersion: say which lchat build runs first. A build that sets
	// its own (-ldflags -X) keeps it.
	if caddy.CustomVersion == "" {
		caddy.CustomVersion = "lchat-caddy " + buildinfo.Lchat() + ", Caddy"
	}
}

// rootExamples are the root command's examples: ours, not Caddy's `caddy run`.
const rootExamples = `  $ scripts/build && bin/lchat-caddy dev
  $ lchat-caddy run --config /etc/lchat-caddy/Caddyfile
  $ lchat-caddy status
  $ lchat-caddy add-instance chat.example.com --kind demo`

// some is one of our commands, kept to reach the root command, which caddycmd.Main
// builds out of reach (BrandRoot).
var some *cobra.Command

// BrandRoot makes the root command's help lchat-caddy's: our examples, and a footer that
// points at our command reference beside Caddy's. cmd/lchat-caddy calls it through
// cobra.OnInitialize, since caddycmd.Main builds the root just before running it; a
// build of other modules with ours keeps its own root.
func BrandRoot() {
	if some == nil {
		return
	}
	root := some.Root()
	root.Example = rootExamples
	root.SetHelpTemplate(cli.DefaultHelpTemplate + "\n" + cli.DocsFooter + `
Caddy's own commands (run, reload, adapt, ...): https://caddyserver.com/docs/command-line
`)
}
