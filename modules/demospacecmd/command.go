// Package demospacecmd registers `lchat-caddy demo-space`, the alias of the
// lchat-demo-space binary: the same demospace.Main, inside the big binary.
package demospacecmd

import (
	"os"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/demospace"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "demo-space",
		Usage: demospace.Usage,
		Short: "Runs the demo chat room a hibernating space serves",
		Long:  "\n" + demospace.Help + "\n\nlchat-demo-space, installed beside lchat-caddy, is the same program without Caddy\n(it starts in a few milliseconds).",
		CobraFunc: func(cmd *cobra.Command) {
			// demospace.Main parses its flags, so both binaries take the same ones.
			cmd.DisableFlagParsing = true
			cmd.RunE = func(_ *cobra.Command, args []string) error {
				// An error exits 1, caddy.ExitCodeFailedStartup.
				return demospace.Main(args, os.Stderr, caddy.Log().Named("demo_space"))
			}
		},
	})
}
