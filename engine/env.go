package engine

import (
	"os"
	"slices"

	"github.com/lchat/lchat-caddy/registry"
)

// instanceEnv builds an instance's environment: this box's PATH, HOME (the space's data
// dir: the one directory that is the space's own, writable by its uid and no other
// space's, so runtimes that look for a home find one; a kind's env may name another),
// the kind's env, the route env names the kind allows, then the LCHAT_ variables, which
// nothing can override (no LCHAT_SOCKET when socket is empty: a socket-activated instance
// is passed its listener).
// It returns the names of route variables it dropped (names only: values are secrets).
func instanceEnv(k Kind, sp Space, socket, control, dataDir string) (env, dropped []string) {
	if p, ok := os.LookupEnv("PATH"); ok {
		env = append(env, "PATH="+p)
	}
	env = append(env, "HOME="+dataDir)
	for n, v := range k.Env {
		env = append(env, n+"="+v)
	}
	for n, v := range sp.Env {
		if registry.ForbiddenEnv(n) || !slices.Contains(k.AllowedEnv, n) {
			dropped = append(dropped, n)
			continue
		}
		env = append(env, n+"="+v)
	}
	env = append(env, "LCHAT_HOST="+sp.Host)
	if socket != "" {
		env = append(env, "LCHAT_SOCKET="+socket)
	}
	env = append(env, "LCHAT_CONTROL_SOCKET="+control, "LCHAT_DATA_DIR="+dataDir)
	slices.Sort(dropped)
	return env, dropped
}
