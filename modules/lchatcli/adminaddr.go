package lchatcli

import (
	"os"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
)

// DefaultAdminSocket is where the shipped Caddyfiles and systemd unit put the admin API:
// a Unix socket only the box's user may open, since spaces run under other uids.
const DefaultAdminSocket = "/run/lchat-caddy/admin.sock"

// adminAddress is the admin API the CLI talks to: --address, else the admin address
// in --config, else LCHAT_ADMIN_LISTEN (what the shipped Caddyfiles read), else the
// shipped socket when it exists, else Caddy's default, localhost:2019 (lchat-caddy
// dev and a Caddyfile without an admin line).
func adminAddress(fs caddycmd.Flags) (string, error) {
	return resolveAdminAddress(fs.String("address"), fs.String("config"), fs.String("adapter"), os.Getenv, os.Stat)
}

func resolveAdminAddress(address, config, adapter string, getenv func(string) string, stat func(string) (os.FileInfo, error)) (string, error) {
	if address == "" && config == "" {
		if v := getenv("LCHAT_ADMIN_LISTEN"); v != "" {
			return v, nil
		}
		if fi, err := stat(DefaultAdminSocket); err == nil && fi.Mode().Type() == os.ModeSocket {
			return "unix/" + DefaultAdminSocket, nil
		}
	}
	return caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
}
