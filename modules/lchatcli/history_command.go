package lchatcli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/internal/cli"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "history",
		Usage: "<host> [--json] [--address <admin>]",
		Short: "Lists a space's checkpoints (time, generation, size) and the log after each: every point restore --at reaches",
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().Bool("json", false, "Print JSON instead of a table")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdHistory)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "restore",
		Usage: "<host> --at <RFC3339|generation> [--address <admin>]",
		Short: "Restores an asleep space to an earlier checkpoint, as a new generation",
		Long: `
Makes the state named by --at the space's current state, as a new generation:
a generation names its checkpoint; an RFC 3339 time the newest acknowledged state
at or before it (the newest checkpoint at or before it, plus the log segments that
had landed by then, for a kind of durability bucket). Restore the generation before
it to undo. Refused, changing nothing, while the space is awake on any box. --at is
required.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().String("at", "", "RFC 3339 time or generation to restore")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdRestore)
		},
	})
}

func cmdHistory(fs caddycmd.Flags) (int, error) {
	host := fs.Arg(0)
	if err := registry.ValidateHost(host); err != nil {
		return cli.ExitUsage, cli.Usage(err)
	}
	var out adminapi.HistoryResponse
	if err := adminCall(fs, http.MethodGet, "/lchat/routes/"+host+"/history", nil, &out); err != nil {
		return cli.ExitFailed, err
	}
	if fs.Bool("json") {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return caddy.ExitCodeSuccess, enc.Encode(out)
	}
	fmt.Printf("%-12s %-24s %-12s %-9s %s\n", "GENERATION", "TIME", "SIZE", "SEGMENTS", "LOG UNTIL")
	for _, cp := range out.Checkpoints {
		segs, until := "-", "-"
		if cp.Log != nil {
			segs, until = fmt.Sprint(cp.Log.Segments), cp.Log.Last.UTC().Format(time.RFC3339)
		}
		fmt.Printf("%-12d %-24s %-12d %-9s %s\n", cp.Generation, cp.At.UTC().Format(time.RFC3339), cp.Size, segs, until)
	}
	return caddy.ExitCodeSuccess, nil
}

func cmdRestore(fs caddycmd.Flags) (int, error) {
	host := fs.Arg(0)
	if err := registry.ValidateHost(host); err != nil {
		return cli.ExitUsage, cli.Usage(err)
	}
	if _, err := spacestore.ParseTarget(fs.String("at")); err != nil {
		return cli.ExitUsage, cli.Usagef("--at: %v", err)
	}
	var out spacestore.RestoreResult
	if err := adminCall(fs, http.MethodPost, "/lchat/routes/"+host+"/restore", adminapi.RestoreRequest{At: fs.String("at")}, &out); err != nil {
		return cli.ExitFailed, err
	}
	if out.Segments > 0 && out.Through != nil {
		fmt.Printf("restored %s to generation %d (%s) plus %d log segments through %s, as generation %d\n", host, out.From.Generation,
			out.From.At.UTC().Format(time.RFC3339), out.Segments, out.Through.UTC().Format(time.RFC3339), out.Generation)
		return caddy.ExitCodeSuccess, nil
	}
	fmt.Printf("restored %s to generation %d (%s) as generation %d\n", host, out.From.Generation, out.From.At.UTC().Format(time.RFC3339), out.Generation)
	return caddy.ExitCodeSuccess, nil
}
