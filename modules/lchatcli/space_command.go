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
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/internal/cli"
	"github.com/lchat/lchat-caddy/registry"
)

// The operator's loop on spaces: status, sleep, wake.
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "status",
		Usage: "[<host>] [--json] [--address <admin>]",
		Short: "Lists every space with its state, box, last checkpoint and held connections",
		Long: `
Lists every route of the running server (or <host>'s alone) with its space's state:
awake (and on which box of the fleet), asleep, or another engine state (waking,
sleeping, failed, ...); "live" for a route without hibernation. LAST CHECKPOINT is
when the bucket's manifest was written (one bucket read per space) and its
generation; HELD is the WebSocket connections and event streams the fleet holds for it.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().Bool("json", false, "Print one JSON object per space instead of a table")
			some = cmd
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.RangeArgs(0, 1), cmdStatus)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "sleep",
		Usage: "<host> [--address <admin>]",
		Short: "Puts an awake space to sleep now (checkpoint, stop, release its lease)",
		Long: `
Puts <host>'s space to sleep on this server now, as the console's "Hibernate now"
does: it is checkpointed to the bucket, stopped and its lease released. Its next
request wakes it again. Refused when the space is not awake on this server.
`,
		CobraFunc: func(cmd *cobra.Command) {
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdSleep)
		},
	})
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "wake",
		Usage: "<host> [--address <admin>]",
		Short: "Wakes a space now, as its first request would",
		Long: `
Wakes <host>'s space on this server, as its first request would (restore from the
bucket, start, wait until ready); it then sleeps after its idle timeout. Refused
when the mesh places the space on another box (that box is named) and for a live
route.
`,
		CobraFunc: func(cmd *cobra.Command) {
			addAdminFlags(cmd)
			cli.Command(cmd, cobra.ExactArgs(1), cmdWake)
		},
	})
}

// hostArg is the command's <host>, checked before any request.
func hostArg(fs caddycmd.Flags) (string, error) {
	host := fs.Arg(0)
	if err := registry.ValidateHost(host); err != nil {
		return "", cli.Usage(err)
	}
	return host, nil
}

func cmdStatus(fs caddycmd.Flags) (int, error) {
	uri := "/lchat/spaces"
	if fs.NArg() == 1 {
		host, err := hostArg(fs)
		if err != nil {
			return cli.ExitUsage, err
		}
		uri += "?host=" + url.QueryEscape(host)
	}
	var ans adminapi.Spaces
	if err := adminCall(fs, http.MethodGet, uri, nil, &ans); err != nil {
		return cli.ExitFailed, err
	}
	if fs.Bool("json") {
		enc := json.NewEncoder(os.Stdout)
		for _, s := range ans.Spaces {
			enc.Encode(s)
		}
		return caddy.ExitCodeSuccess, nil
	}
	printStatus(os.Stdout, ans.Spaces, time.Now())
	return caddy.ExitCodeSuccess, nil
}

// printStatus prints the status table; now dates the ages of checkpoints.
func printStatus(w io.Writer, spaces []box.SpaceReport, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tKIND\tSTATE\tBOX\tLAST CHECKPOINT\tHELD")
	for _, s := range spaces {
		ckpt := "-"
		if st := s.Stored; st != nil && !st.WrittenAt.IsZero() {
			ckpt = fmt.Sprintf("%s ago (gen %d)", now.Sub(st.WrittenAt).Round(time.Second), st.Generation)
		}
		held := "-"
		if c := s.FleetConns; c != nil {
			held = fmt.Sprint(c.Open + c.Streams)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Host, dash(s.Kind), spaceState(s), dash(strings.Join(s.AwakeOn, ",")), ckpt, held)
	}
	tw.Flush()
}

// spaceState is one word for where a space stands: "live" for a route without
// hibernation; awake when a box of the fleet runs it; else this box's engine state, or
// "asleep" when this box never ran it.
func spaceState(s box.SpaceReport) string {
	switch {
	case !s.Hibernate:
		return "live"
	case len(s.AwakeOn) > 0:
		return "awake"
	case s.State == "":
		return "asleep"
	}
	return s.State
}

func cmdSleep(fs caddycmd.Flags) (int, error) {
	host, err := hostArg(fs)
	if err != nil {
		return cli.ExitUsage, err
	}
	if err := adminCall(fs, http.MethodPost, "/lchat/routes/"+host+"/sleep", nil, nil); err != nil {
		return cli.ExitFailed, err
	}
	fmt.Printf("%s is asleep (checkpointed to the bucket)\n", host)
	return caddy.ExitCodeSuccess, nil
}

func cmdWake(fs caddycmd.Flags) (int, error) {
	host, err := hostArg(fs)
	if err != nil {
		return cli.ExitUsage, err
	}
	if err := adminCall(fs, http.MethodPost, "/lchat/routes/"+host+"/wake", nil, nil); err != nil {
		return cli.ExitFailed, err
	}
	fmt.Printf("%s is awake\n", host)
	return caddy.ExitCodeSuccess, nil
}
