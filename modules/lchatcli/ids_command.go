package lchatcli

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/internal/cli"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "next-id",
		Usage: "[--address <admin>]",
		Short: "Allocates the next id from the shared id ledger",
		Long: `
Prints the next id of the namespace in the running server's LCHAT_CLOUD_ID_LEDGER,
drawn from ledger/<namespace> in its bucket: unique across every box on that bucket,
never reused. Fails when the server runs without LCHAT_CLOUD_ID_LEDGER.
`,
		CobraFunc: func(cmd *cobra.Command) {
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.NoArgs, cmdNextID)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "seed-ids",
		Usage: "<min> [--address <admin>]",
		Short: "Makes every later id of the shared id ledger at least <min>",
		Long: `
Seeds the running server's id ledger (LCHAT_CLOUD_ID_LEDGER) so every id handed out
afterwards is at least <min>: run it with one above the highest id minted before the
ledger was switched on. It refuses to lower the counter and then changes nothing.
`,
		CobraFunc: func(cmd *cobra.Command) {
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdSeedIDs)
		},
	})
}

func cmdNextID(fs caddycmd.Flags) (int, error) {
	var res adminapi.IDResult
	if err := adminCall(fs, http.MethodPost, "/lchat/ids", nil, &res); err != nil {
		return cli.ExitFailed, err
	}
	fmt.Println(res.ID)
	return caddy.ExitCodeSuccess, nil
}

func cmdSeedIDs(fs caddycmd.Flags) (int, error) {
	min, err := strconv.ParseUint(fs.Arg(0), 10, 64)
	if err != nil || min == 0 {
		return cli.ExitUsage, cli.Usagef("<min> must be a positive integer, got %q", fs.Arg(0))
	}
	var res adminapi.SeedIDsResult
	if err := adminCall(fs, http.MethodPost, "/lchat/ids/seed", adminapi.SeedIDsRequest{Min: min}, &res); err != nil {
		return cli.ExitFailed, err
	}
	fmt.Printf("id ledger %s: the next id is %d\n", res.Namespace, res.Next)
	return caddy.ExitCodeSuccess, nil
}
