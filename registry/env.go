package registry

import "strings"

// forbiddenEnvExact and forbiddenEnvPrefixes are the env names no route may set, whatever
// its kind allows, wherever the route came from (admin API, replication): the loader's, the
// shell's and interpreters' hooks, and the LCHAT_ variables the box itself provides.
var forbiddenEnvExact = map[string]bool{
	"PATH": true, "BASH_ENV": true, "ENV": true, "IFS": true, "SHELL": true, "SHELLOPTS": true,
	"BASHOPTS": true, "PS4": true, "PROMPT_COMMAND": true, "CDPATH": true, "GLOBIGNORE": true,
	"HOME": true, "TMPDIR": true, "USER": true, "LOGNAME": true, "GCONV_PATH": true, "LOCPATH": true,
	"NLSPATH": true, "HOSTALIASES": true, "RES_OPTIONS": true, "LOCALDOMAIN": true, "NODE_OPTIONS": true,
	"PYTHONPATH": true, "PYTHONSTARTUP": true, "PERL5LIB": true, "PERL5OPT": true, "RUBYOPT": true,
	"RUBYLIB": true, "GODEBUG": true, "GOTRACEBACK": true, "JAVA_TOOL_OPTIONS": true,
	"SSL_CERT_FILE": true, "SSL_CERT_DIR": true,
}

var forbiddenEnvPrefixes = []string{"LD_", "DYLD_", "MALLOC_", "BASH_FUNC_", "LCHAT_"}

// ForbiddenEnv reports whether a route may never carry the env variable name: an invalid
// name, or one on the deny list above (compared case-insensitively).
func ForbiddenEnv(name string) bool {
	if ValidateEnvName(name) != nil {
		return true
	}
	up := strings.ToUpper(name)
	if forbiddenEnvExact[up] {
		return true
	}
	for _, p := range forbiddenEnvPrefixes {
		if strings.HasPrefix(up, p) {
			return true
		}
	}
	return false
}
