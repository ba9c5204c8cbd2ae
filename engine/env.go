package engine

import (
	"os"
	"slices"
	"strings"
)

// forbiddenExact are variables that change how a program is loaded or a shell behaves; a
// route can never set them, whatever its kind allows.
var forbiddenExact = map[string]bool{
	"PATH": true, "BASH_ENV": true, "ENV": true, "IFS": true, "SHELL": true, "SHELLOPTS": true,
	"BASHOPTS": true, "PS4": true, "PROMPT_COMMAND": true, "CDPATH": true, "GLOBIGNORE": true,
	"HOME": true, "TMPDIR": true, "GCONV_PATH": true, "LOCPATH": true, "NLSPATH": true,
	"HOSTALIASES": true, "RES_OPTIONS": true, "LOCALDOMAIN": true, "NODE_OPTIONS": true,
	"PYTHONPATH": true, "PYTHONSTARTUP": true, "PERL5LIB": true, "PERL5OPT": true, "RUBYOPT": true,
	"RUBYLIB": true, "GODEBUG": true, "JAVA_TOOL_OPTIONS": true, "SSL_CERT_FILE": true, "SSL_CERT_DIR": true,
}

var forbiddenPrefixes = []string{"LD_", "DYLD_", "MALLOC_", "BASH_FUNC_", "LCHAT_"}

func forbiddenEnv(name string) bool {
	if !validEnvName(name) || forbiddenExact[strings.ToUpper(name)] {
		return true
	}
	up := strings.ToUpper(name)
	for _, p := range forbiddenPrefixes {
		if strings.HasPrefix(up, p) {
			return true
		}
	}
	return false
}

func validEnvName(n string) bool {
	if n == "" {
		return false
	}
	for i, r := range n {
		ok := r == '_' || (r >= 'A' && r <= 'Z') || (r >= 'a' && r <= 'z') || (i > 0 && r >= '0' && r <= '9')
		if !ok {
			return false
		}
	}
	return true
}

// instanceEnv builds an instance's environment: this box's PATH, the kind's env, the route
// env names the kind allows, then the three LCHAT_ variables, which nothing can override.
// It returns the names of route variables it dropped (names only: values are secrets).
func instanceEnv(k Kind, sp Space, socket, dataDir string) (env, dropped []string) {
	if p, ok := os.LookupEnv("PATH"); ok {
		env = append(env, "PATH="+p)
	}
	for n, v := range k.Env {
		env = append(env, n+"="+v)
	}
	for n, v := range sp.Env {
		if forbiddenEnv(n) || !slices.Contains(k.AllowedEnv, n) {
			dropped = append(dropped, n)
			continue
		}
		env = append(env, n+"="+v)
	}
	env = append(env, "LCHAT_HOST="+sp.Host, "LCHAT_SOCKET="+socket, "LCHAT_DATA_DIR="+dataDir)
	slices.Sort(dropped)
	return env, dropped
}
