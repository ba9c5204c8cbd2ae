package lchatcli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/internal/cli"
	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/registry"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "delegate",
		Usage: "<host> --to <provider> [--address <admin>]",
		Short: "Moves a hibernating space to a provider (the lchat app's providers)",
		Long: `
Moves a hibernating space to <provider>, a partner named in the lchat app's
providers, which runs it from its own bucket while its address, certificate and
members stay here (docs/providers.md):

1. The route turns "delegating": every box of this fleet puts the space to sleep
   and answers its requests 503 with Retry-After meanwhile.
2. Its state, once its lease is free, is handed to the provider as a signed
   export, with its env values; the provider hosts it, held asleep.
3. The route names the provider: every box forwards the space's requests there;
   the provider is asked to serve it.

A failure half-way puts the route back: the space is served by this fleet, as
before (when the provider's answer to step 3 is lost and it cannot delete the
space, the route stays with it instead, and the error says so). Re-running a
finished delegation changes nothing but asking the provider to serve it again;
re-running one left half-way finishes it.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().String("to", "", "The provider")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdDelegate)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "reclaim",
		Usage: "<host> [--address <admin>]",
		Short: "Moves a delegated space back from its provider",
		Long: `
Moves a space delegated to a provider back to this fleet:

1. The route turns "reclaiming": this fleet stops forwarding and answers 503 with
   Retry-After; the provider puts the space to sleep and holds it asleep.
2. Its state, with everything written at the provider, comes back as a signed
   export into this fleet's bucket.
3. The route is this fleet's again; the provider stops hosting it.

A failure half-way puts the route back: the provider serves the space, as before.
Re-running a finished reclaim changes nothing; re-running one left half-way
finishes it.
`,
		CobraFunc: func(cmd *cobra.Command) {
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdReclaim)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "providers",
		Usage: "[--json] [--address <admin>]",
		Short: "Lists the providers, their health and delegated spaces, and the fleets hosted here",
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().Bool("json", false, "Print the raw JSON")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.NoArgs, cmdProviders)
		},
	})
}

func cmdDelegate(fs caddycmd.Flags) (int, error) {
	host := fs.Arg(0)
	if err := registry.ValidateHost(host); err != nil {
		return cli.ExitUsage, cli.Usage(err)
	}
	to := fs.String("to")
	if to == "" {
		return cli.ExitUsage, cli.Usagef("--to <provider> is required")
	}
	if err := registry.ValidateProviderName(to); err != nil {
		return cli.ExitUsage, cli.Usage(err)
	}
	var res provider.Moved
	if err := adminCall(fs, http.MethodPost, "/lchat/providers/delegate/"+url.PathEscape(host), adminapi.DelegateRequest{To: to}, &res); err != nil {
		return cli.ExitFailed, err
	}
	if res.Already {
		fmt.Printf("%s is already delegated to %s; nothing changed\n", res.Host, res.Provider)
		return caddy.ExitCodeSuccess, nil
	}
	fmt.Printf("delegated %s to %s: generation %d, %d objects, %d bytes handed over; every box now forwards it there\n",
		res.Host, res.Provider, res.Generation, res.Objects, res.Bytes)
	return caddy.ExitCodeSuccess, nil
}

func cmdReclaim(fs caddycmd.Flags) (int, error) {
	host := fs.Arg(0)
	if err := registry.ValidateHost(host); err != nil {
		return cli.ExitUsage, cli.Usage(err)
	}
	var res provider.Moved
	if err := adminCall(fs, http.MethodPost, "/lchat/providers/reclaim/"+url.PathEscape(host), nil, &res); err != nil {
		return cli.ExitFailed, err
	}
	if res.Already {
		fmt.Printf("%s is served by this fleet; nothing changed\n", res.Host)
		return caddy.ExitCodeSuccess, nil
	}
	fmt.Printf("reclaimed %s from %s: generation %d, %d objects, %d bytes taken back; this fleet serves it again\n",
		res.Host, res.Provider, res.Generation, res.Objects, res.Bytes)
	if res.Note != "" {
		fmt.Printf("note: %s\n", res.Note)
	}
	return caddy.ExitCodeSuccess, nil
}

func cmdProviders(fs caddycmd.Flags) (int, error) {
	var res adminapi.Providers
	if err := adminCall(fs, http.MethodGet, "/lchat/providers", nil, &res); err != nil {
		return cli.ExitFailed, err
	}
	if fs.Bool("json") {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return caddy.ExitCodeSuccess, enc.Encode(res)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tURL\tHEALTH\tREQUESTS\tERRORS\tSPACES")
	for _, p := range res.Providers {
		health := "ok"
		switch {
		case p.Health == "unknown":
			health = "unknown (no request yet)"
		case !p.Healthy:
			health = "failing: " + p.LastError
		}
		var spaces []string
		for _, s := range p.Spaces {
			if s.State == "serving" {
				spaces = append(spaces, s.Host)
			} else {
				spaces = append(spaces, s.Host+" ("+s.State+")")
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", p.Name, p.URL, health, p.Requests, p.Errors, dash(strings.Join(spaces, ", ")))
	}
	for _, c := range res.Clients {
		fmt.Fprintf(tw, "client %s\t\t\t\t\t%s\n", c.Name, dash(strings.Join(c.Spaces, ", ")))
	}
	tw.Flush()
	return caddy.ExitCodeSuccess, nil
}
