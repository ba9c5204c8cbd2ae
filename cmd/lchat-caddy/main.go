// Command lchat-caddy is Caddy with the standard modules and every lchat module built in.
package main

import (
	"os"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/lchat/lchat-caddy"
	"github.com/lchat/lchat-caddy/modules/lchatcli"
)

func main() {
	// Usage lines and help name the command people type.
	caddy.CustomBinaryName = "lchat-caddy"
	caddy.CustomLongDescription = `lchat-caddy is Caddy with the lchat modules built in: an edge proxy for a
fleet of hibernating spaces (wake on request, sleep when idle, state in S3),
several boxes sharing one bucket without a coordinator, and make-before-break
DERP region switching.

Start here:

	lchat-caddy dev                      a local box with a demo space and the console
	lchat-caddy run --config Caddyfile   a real box (see caddyfiles/ and the README)
	lchat-caddy status                   every space: awake or asleep, where, last checkpoint
	lchat-caddy add-instance <host> --kind <kind>
	lchat-caddy sleep <host>, wake <host>
	lchat-caddy fleet
`
	// The root's help is ours once it is built (lchatcli.BrandRoot). cobra runs its
	// initializers for `lchat-caddy help [cmd]` and every command that runs, but not for
	// the root alone or a bare --help, which print the same help.
	cobra.OnInitialize(lchatcli.BrandRoot)
	switch {
	case len(os.Args) == 1:
		os.Args = append(os.Args, "help")
	case len(os.Args) == 2 && (os.Args[1] == "--help" || os.Args[1] == "-h"):
		os.Args[1] = "help"
	}
	caddycmd.Main()
}
