package lchatcli

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/internal/cli"
	"github.com/lchat/lchat-caddy/mesh"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "mesh-token",
		Short: "Prints a fresh random LCHAT_MESH_TOKEN",
		Long: `
Prints a fresh random mesh token (32 random bytes, base64url: 43 characters) for
LCHAT_MESH_TOKEN. Every box of a mesh needs the same value; a box refuses to start
with a token shorter than 32 characters.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cli.Command(cmd, cobra.NoArgs, func(caddycmd.Flags) (int, error) {
				fmt.Println(mesh.NewToken())
				return caddy.ExitCodeSuccess, nil
			})
		},
	})
}
