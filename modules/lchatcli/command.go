// Package lchatcli is lchat-caddy's CLI subcommands that act on a running server:
// add-instance, remove, routes, hibernate, history, restore, mesh-seed, fleet, relocate,
// next-id and seed-ids talk to it through its admin API (the lchat app's endpoints,
// modules/lchat; their wire format is package adminapi), because the registry file is
// locked by the server; mesh-token is local. The server's own `dev` command is in
// modules/lchat.
package lchatcli

import (
	"encoding/json"
	"fmt"
	"io"
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
	"github.com/lchat/lchat-caddy/registry"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "add-instance",
		Usage: "<host>|--mint --kind <kind> [--version <v>] [--env NAME=VALUE ...] [--home-region <r>] [--upstream <addr>] [--address <admin>]",
		Short: "Creates a route: a hibernating space of a configured kind, or a live route with --upstream",
		Long: `
Creates the route for <host> on the running server through its admin API
(POST /lchat/routes). With --kind the route is a hibernating space: it wakes on
its first request. With --upstream (and no kind) it is a live route proxied to
that address or Unix socket path.

--env sets the instance's own environment (admin token, entitlement, ...); the
kind must allow each name. Values are stored for the instance and never printed.

--mint, instead of <host>, names the space from the next id: <base36(id)> under
the first wildcard domain (7ps.example.com for id 10000). The id comes from the
shared ledger of LCHAT_CLOUD_ID_LEDGER when the server has it set, so boxes
minting at once never collide; otherwise from a counter of this box alone.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().Bool("mint", false, "Name the host from the next id (<base36(id)>.<first wildcard domain>)")
			cmd.Flags().String("kind", "", "Kind of the space (configured in the lchat app)")
			cmd.Flags().String("version", "", "Version of the instance")
			cmd.Flags().StringArray("env", nil, "Instance env NAME=VALUE (repeatable)")
			cmd.Flags().String("home-region", "", "Home region of the space")
			cmd.Flags().String("upstream", "", "Live route: dial address or Unix socket path")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.RangeArgs(0, 1), cmdAddInstance)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "remove",
		Usage: "<host> [--discard] [--address <admin>]",
		Short: "Removes a route, saving and stopping its space (bucket data is kept)",
		Long: `
Removes <host>'s route. An awake space is stopped and checkpointed first, so
every write it acknowledged is in the bucket (a re-created route finds it); if
the checkpoint fails the route is still removed, the local state is kept and
the command fails. --discard stops the space without saving what it wrote
since its last checkpoint.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().Bool("discard", false, "Drop the space's writes since its last checkpoint instead of saving them")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdRemove)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "routes",
		Usage: "[--json] [--address <admin>]",
		Short: "Lists the routes of the running server (env names only)",
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().Bool("json", false, "Print JSON lines instead of a table")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.NoArgs, cmdRoutes)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "hibernate",
		Usage: "<host> --on|--off [--upstream <addr>] [--address <admin>]",
		Short: "Turns hibernation of a route on or off",
		Long: `
--on makes <host> a hibernating space (its kind must be set and configured).
--off makes it a live route proxied to its upstream (give --upstream if it has
none); an awake space is put to sleep first.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().Bool("on", false, "Hibernate the route")
			cmd.Flags().Bool("off", false, "Serve the route live")
			cmd.Flags().String("upstream", "", "Live upstream for --off")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdHibernate)
		},
	})
}

func addAdminFlags(cmd *cobra.Command) {
	cmd.Flags().String("address", "", "The address of the administration API endpoint (default: $LCHAT_ADMIN_LISTEN, else unix//run/lchat-caddy/admin.sock when it exists, else localhost:2019)")
	cmd.Flags().StringP("config", "c", "", "Configuration file to find the admin address in")
	cmd.Flags().StringP("adapter", "a", "", "Name of config adapter to apply")
}

func parseEnvFlags(vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(vals))
	for i, kv := range vals {
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			// Never echo the argument: it may be a bare secret.
			return nil, fmt.Errorf("--env #%d: expected NAME=VALUE", i+1)
		}
		if err := registry.ValidateEnvName(name); err != nil {
			return nil, fmt.Errorf("--env #%d: %v", i+1, err)
		}
		env[name] = val
	}
	return env, nil
}

func cmdAddInstance(fs caddycmd.Flags) (int, error) {
	host, mint := fs.Arg(0), fs.Bool("mint")
	switch {
	case mint && host != "":
		return cli.ExitUsage, cli.Usagef("give <host> or --mint, not both")
	case !mint:
		if err := registry.ValidateHost(host); err != nil {
			return cli.ExitUsage, cli.Usage(err)
		}
	}
	envVals, err := fs.GetStringArray("env")
	if err != nil {
		return cli.ExitUsage, cli.Usage(err)
	}
	env, err := parseEnvFlags(envVals)
	if err != nil {
		return cli.ExitUsage, cli.Usage(err)
	}
	if r := fs.String("home-region"); r != "" {
		if err := registry.ValidateRegion(r); err != nil {
			return cli.ExitUsage, cli.Usagef("--home-region: %v", err)
		}
	}
	req := adminapi.CreateRequest{
		Mint:       mint,
		Host:       host,
		Kind:       fs.String("kind"),
		Version:    fs.String("version"),
		HomeRegion: fs.String("home-region"),
		Env:        env,
		Upstream:   fs.String("upstream"),
	}
	if req.Kind == "" && req.Upstream == "" {
		return cli.ExitUsage, cli.Usagef("--kind is required (or --upstream for a live route)")
	}
	var out registry.Summary
	if err := adminCall(fs, http.MethodPost, "/lchat/routes", req, &out); err != nil {
		return cli.ExitFailed, err
	}
	printSummary(os.Stdout, out)
	return caddy.ExitCodeSuccess, nil
}

func cmdRemove(fs caddycmd.Flags) (int, error) {
	host := fs.Arg(0)
	if err := registry.ValidateHost(host); err != nil {
		return cli.ExitUsage, cli.Usage(err)
	}
	uri := "/lchat/routes/" + host
	if fs.Bool("discard") {
		uri += "?discard=true"
	}
	if err := adminCall(fs, http.MethodDelete, uri, nil, nil); err != nil {
		return cli.ExitFailed, err
	}
	fmt.Printf("removed %s\n", host)
	return caddy.ExitCodeSuccess, nil
}

func cmdRoutes(fs caddycmd.Flags) (int, error) {
	asJSON := fs.Bool("json")
	// The state of every space, read once (no bucket reads: `status` has checkpoints).
	var states adminapi.Spaces
	if !asJSON {
		if err := adminCall(fs, http.MethodGet, "/lchat/spaces?stored=false", nil, &states); err != nil {
			return cli.ExitFailed, err
		}
	}
	state := make(map[string]string, len(states.Spaces))
	for _, s := range states.Spaces {
		state[s.Host] = spaceState(s)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	if !asJSON {
		fmt.Fprintln(tw, "HOST\tKIND\tSTATE\tVERSION\tHIBERNATE\tHOME_REGION\tUPSTREAM\tENV")
	}
	enc := json.NewEncoder(os.Stdout)
	after := ""
	for {
		var page adminapi.RoutesPage
		uri := "/lchat/routes?limit=500"
		if after != "" {
			uri += "&after=" + url.QueryEscape(after)
		}
		if err := adminCall(fs, http.MethodGet, uri, nil, &page); err != nil {
			return cli.ExitFailed, err
		}
		for _, s := range page.Routes {
			if asJSON {
				enc.Encode(s)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\n", s.Host, dash(s.Kind), dash(state[s.Host]), dash(s.Version), s.Hibernate,
				dash(s.HomeRegion), dash(s.Upstream), dash(strings.Join(s.EnvNames, ",")))
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	tw.Flush()
	return caddy.ExitCodeSuccess, nil
}

func cmdHibernate(fs caddycmd.Flags) (int, error) {
	host := fs.Arg(0)
	if err := registry.ValidateHost(host); err != nil {
		return cli.ExitUsage, cli.Usage(err)
	}
	on, off := fs.Bool("on"), fs.Bool("off")
	if on == off {
		return cli.ExitUsage, cli.Usagef("give exactly one of --on or --off")
	}
	upstream := fs.String("upstream")
	if on && upstream != "" {
		return cli.ExitUsage, cli.Usagef("--upstream goes with --off: a hibernating space has no upstream")
	}
	if off && upstream == "" {
		// The server would refuse the row in the registry's words; say it in the flags'.
		var cur registry.Summary
		if err := adminCall(fs, http.MethodGet, "/lchat/routes/"+host, nil, &cur); err != nil {
			return cli.ExitFailed, err
		}
		if cur.Upstream == "" && cur.LivesAt == "" {
			return cli.ExitUsage, cli.Usagef("--off needs --upstream <addr>: %s has no upstream to serve it live", host)
		}
	}
	var out registry.Summary
	req := adminapi.HibernateRequest{Hibernate: &on, Upstream: upstream}
	if err := adminCall(fs, http.MethodPost, "/lchat/routes/"+host+"/hibernate", req, &out); err != nil {
		return cli.ExitFailed, err
	}
	printSummary(os.Stdout, out)
	return caddy.ExitCodeSuccess, nil
}

func printSummary(w io.Writer, s registry.Summary) {
	fmt.Fprintf(w, "host:        %s\n", s.Host)
	if s.Hibernate {
		fmt.Fprintf(w, "kind:        %s\n", s.Kind)
	} else {
		fmt.Fprintf(w, "upstream:    %s\n", s.Upstream)
	}
	fmt.Fprintf(w, "hibernate:   %t\n", s.Hibernate)
	if s.Version != "" {
		fmt.Fprintf(w, "version:     %s\n", s.Version)
	}
	if s.HomeRegion != "" {
		fmt.Fprintf(w, "home_region: %s\n", s.HomeRegion)
	}
	if len(s.EnvNames) > 0 {
		fmt.Fprintf(w, "env:         %s (values hidden)\n", strings.Join(s.EnvNames, ", "))
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
