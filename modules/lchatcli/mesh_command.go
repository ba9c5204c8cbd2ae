package lchatcli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/internal/cli"
	"github.com/lchat/lchat-caddy/mesh"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "mesh-seed",
		Usage: "[--env-file F] [--region R] [--prune] <peer-url> [--address <admin>]",
		Short: "Replicates every in-scope route of the running server to a mesh peer",
		Long: `
Bulk-replicates every in-scope route (hosts under the mesh domains; with --region,
also every route whose home_region is R) from the running server to the peer at
<peer-url>, its LCHAT_MESH_SELF, in one pass, printing progress. The server sends
the rows itself, so env values never pass through this command.

--prune also tombstones the peer's in-scope rows this server no longer has. It
refuses to run when this server has zero in-scope rows: a misread registry must
never mass-delete a peer.

--env-file reads LCHAT_MESH_DOMAINS and LCHAT_MESH_TOKEN from a file such as
/data/router.env, for the seed's scope and the peer's token.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().String("env-file", "", "Read LCHAT_MESH_* from this environment file")
			cmd.Flags().String("region", "", "Also seed routes whose home_region is this region")
			cmd.Flags().Bool("prune", false, "Tombstone peer rows this registry no longer has")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdMeshSeed)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "fleet",
		Usage: "[--json] [--address <admin>]",
		Short: "Shows every live box of the mesh",
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().Bool("json", false, "Print the raw JSON")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.NoArgs, cmdFleet)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "relocate",
		Usage: "<host> --to <region> [--move-dns] [--address <admin>]",
		Short: "Moves a hibernating space to another region's boxes",
		Long: `
Moves a hibernating space (asleep everywhere) to <region>, in three steps:

1. Store: when <region>'s boxes share this server's bucket, nothing is copied.
   When mesh.region_buckets names another bucket for <region>, spaces/<host>/
   (blobs, then the manifest; never the lease) is streamed there, unless it
   already holds the same or a newer generation. It refuses while the space is
   awake in either bucket.
2. Flips the route's home_region and replicates the row to the boxes of both
   regions, so the mesh places the space on a box of <region>.
3. --move-dns sets the host's A record, through the mesh.relocate_dns provider,
   to the public address (mesh.public_address) of a live <region> box. Without
   a provider, or without such a box, it fails before changing anything.

Re-running a relocation is safe: each finished step is a no-op the second time.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().String("to", "", "Destination region")
			cmd.Flags().Bool("move-dns", false, "Repoint the host's DNS record too")
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdRelocate)
		},
	})
}

func cmdMeshSeed(fs caddycmd.Flags) (int, error) {
	peer, err := mesh.ParseSelf(fs.Arg(0))
	if err != nil {
		return cli.ExitUsage, cli.Usagef("peer URL: %v", err)
	}
	req := adminapi.SeedRequest{Peer: peer, Region: fs.String("region"), Prune: fs.Bool("prune")}
	if f := fs.String("env-file"); f != "" {
		cfg, err := mesh.ParseEnvFile(f, nil)
		if err != nil {
			return caddy.ExitCodeFailedStartup, fmt.Errorf("--env-file: %v", err)
		}
		if !cfg.Enabled() {
			// ParseEnv reads nothing else without SELF: the file's domains and token
			// would be ignored without a word.
			return cli.ExitUsage, cli.Usagef("--env-file: %s does not set %s", f, mesh.EnvSelf)
		}
		req.Domains, req.Token = cfg.Domains, string(cfg.Token)
	}
	body, _ := json.Marshal(req)
	resp, err := adminRequest(fs, http.MethodPost, "/lchat/mesh/seed", bytes.NewReader(body))
	if err != nil {
		return cli.ExitFailed, err
	}
	defer resp.Body.Close()
	fmt.Printf("seeding %s\n", peer)
	sc := bufio.NewScanner(resp.Body)
	var last adminapi.SeedEvent
	for sc.Scan() {
		var ev adminapi.SeedEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		last = ev
		switch ev.Event {
		case "plan":
			fmt.Printf("plan: %d rows to replicate, %d to tombstone (peer has %d in scope)\n", ev.Puts, ev.Tombs, ev.Of)
		case "put":
			fmt.Printf("[%d/%d] replicated %s\n", ev.N, ev.Of, ev.Host)
		case "tombstone":
			fmt.Printf("[%d/%d] tombstoned %s\n", ev.N, ev.Of, ev.Host)
		case "error":
			fmt.Printf("[%d/%d] FAILED %s: %s\n", ev.N, ev.Of, ev.Host, ev.Error)
		case "done":
			fmt.Printf("done: %d replicated, %d tombstoned, %d failed\n", ev.Puts, ev.Tombs, ev.Fails)
		}
	}
	if err := sc.Err(); err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("reading progress: %v", err)
	}
	if last.Event != "done" {
		return caddy.ExitCodeFailedStartup, errors.New("mesh-seed ended early; see the server log")
	}
	if last.Fails > 0 {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("%d operations failed", last.Fails)
	}
	return caddy.ExitCodeSuccess, nil
}

func cmdFleet(fs caddycmd.Flags) (int, error) {
	var f adminapi.Fleet
	if err := adminCall(fs, http.MethodGet, "/lchat/fleet", nil, &f); err != nil {
		return cli.ExitFailed, err
	}
	if fs.Bool("json") {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return caddy.ExitCodeSuccess, enc.Encode(f)
	}
	printFleet(os.Stdout, f)
	return caddy.ExitCodeSuccess, nil
}

func printFleet(w io.Writer, f adminapi.Fleet) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SELF\tREGION\tHEARTBEAT\tVERSION\tAWAKE\tWARM SET\tBUDGET\tFORWARDS\tWAKES\tLEASE CONFLICTS\tSTATE")
	for _, m := range f.Members {
		state := "ok"
		switch {
		case m.Error != "":
			state = "unreachable: " + m.Error
		case m.Fenced:
			state = "fenced"
		}
		if m.Self == f.Self {
			state += " (this box)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%s\n", m.Self, dash(m.Region), m.HeartbeatAge, dash(m.Version),
			len(m.Awake), bytesOrDash(m.WarmSet), bytesOrDash(m.Budget), m.Counters["forwards"], m.Counters["wakes"], m.Counters["lease_conflicts"], state)
	}
	tw.Flush()
	if c := f.Capacity; c != nil {
		// The same names as the metrics, so a script can read either.
		fmt.Fprintf(w, "\nlchat_fleet_desired_boxes %d\n", c.DesiredBoxes)
		fmt.Fprintf(w, "lchat_box_warm_set_bytes %d\n", c.BoxWarmSet)
		fmt.Fprintf(w, "lchat_box_memory_budget_bytes %d\n", c.BoxBudgetOwn)
		fmt.Fprintf(w, "fleet: %d boxes, warm set %s, budget %s a box, headroom %.0f%%, hysteresis %.0f%%: wants %d boxes\n",
			c.Boxes, bytesOrDash(c.WarmSet), bytesOrDash(c.BoxBudget), c.Headroom*100, c.Hysteresis*100, c.DesiredBoxes)
	}
}

// bytesOrDash is n bytes for people (IEC units), or "-" for 0 (not published).
func bytesOrDash(n int64) string {
	if n <= 0 {
		return "-"
	}
	return humanize.IBytes(uint64(n))
}

func cmdRelocate(fs caddycmd.Flags) (int, error) {
	host := strings.ToLower(fs.Arg(0))
	to := fs.String("to")
	if to == "" {
		return cli.ExitUsage, cli.Usagef("--to <region> is required")
	}
	var res adminapi.RelocateResult
	err := adminCall(fs, http.MethodPost, "/lchat/mesh/relocate/"+url.PathEscape(host),
		adminapi.RelocateRequest{To: to, MoveDNS: fs.Bool("move-dns")}, &res)
	if err != nil {
		return cli.ExitFailed, err
	}
	if res.Already {
		fmt.Printf("%s already has home region %s; re-replicated\n", res.Host, res.To)
	} else {
		fmt.Printf("relocated %s: %s → %s\n", res.Host, dash(res.From), res.To)
	}
	fmt.Printf("store: %s\n", res.Store)
	fmt.Printf("home_region flipped + route re-fanned-out to %d peers — the mesh now places %s on a %s box\n",
		len(res.Fanout), res.Host, res.To)
	if res.DNS != "" {
		fmt.Printf("dns: %s\n", res.DNS)
	}
	return caddy.ExitCodeSuccess, nil
}
