// Package demospacecmd registers `lchat-caddy demo-space`, the alias of the
// lchat-demo-space binary: the same demospace.Main, inside the big binary.
package demospacecmd

import (
	"fmt"
	"os"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/demospace"
	"github.com/lchat/lchat-caddy/internal/cli"
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
				// An error is one plain line and exit 1, as every lchat command's
				// (internal/cli), not a JSON log line.
				if err := demospace.Main(args, os.Stderr, caddy.Log().Named("demo_space")); err != nil {
					fmt.Fprintln(os.Stderr, cli.Line(err))
					os.Exit(cli.ExitFailed)
				}
				return nil
			}
		},
	})
}
