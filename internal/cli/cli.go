// Package cli is how lchat-caddy's own subcommands end: an error is one plain line on
// stderr ("Error: host "BAD_HOST" must be lowercase"), never a JSON log line or a stack,
// and the exit code says what kind of failure it was (docs/cli.md lists them).
//
// Caddy's caddycmd.WrapCommandFuncForCobra prints a command's error through Caddy's
// logger, as a JSON line; that stays for Caddy's own commands (run, reload, ...). Ours
// are set up with Command instead.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// Exit codes of lchat-caddy's own subcommands.
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitFailed: the command ran and failed (the server refused the change, the bucket
	// could not be reached, a check could not run).
	ExitFailed = 1
	// ExitCheckFailed: bucket-check ran and a race had the wrong number of winners.
	ExitCheckFailed = 2
	// ExitUnreachable: no connection to the admin API (nothing listens at the address,
	// no such socket, permission denied on it).
	ExitUnreachable = 3
	// ExitUsage: bad input, refused before any request: a wrong argument count, an
	// unknown flag, an invalid host, bucket name or URL.
	ExitUsage = 4
)

type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

type unreachableError struct{ err error }

func (e unreachableError) Error() string { return e.err.Error() }
func (e unreachableError) Unwrap() error { return e.err }

// Usage marks err as bad input (ExitUsage).
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// Usagef is Usage(fmt.Errorf(format, args...)).
func Usagef(format string, args ...any) error { return Usage(fmt.Errorf(format, args...)) }

// Unreachable marks err as a failure to connect to the admin API (ExitUnreachable).
func Unreachable(err error) error {
	if err == nil {
		return nil
	}
	return unreachableError{err}
}

// Code is the exit code for a command that returned status and err: the kind of err
// when it has one (Usage, Unreachable), else status, and at least ExitFailed for an error.
func Code(status int, err error) int {
	var u usageError
	var n unreachableError
	switch {
	case errors.As(err, &u):
		return ExitUsage
	case errors.As(err, &n):
		return ExitUnreachable
	case err != nil && status == ExitOK:
		return ExitFailed
	}
	return status
}

// Line is err as the one line printed for it: "Error: " and the message with its line
// breaks folded, so a multi-line server message stays one line.
func Line(err error) string {
	return "Error: " + strings.Join(strings.Fields(err.Error()), " ")
}

// DefaultHelpTemplate is cobra's own help template, which Caddy's root command extends
// with a footer pointing at Caddy's documentation; ours point at our own (DocsFooter).
var DefaultHelpTemplate = (&cobra.Command{}).HelpTemplate()

// DocsFooter ends the help of lchat-caddy's own commands.
const DocsFooter = `Every lchat-caddy command, its flags and exit codes:
https://github.com/lchat/lchat-caddy/blob/main/docs/cli.md
`

// exit ends the process; a variable so a test can watch it.
var exit = os.Exit

// Command makes f cmd's body: args checks the positional arguments (nil: any), a bad
// argument count or flag is a usage error, and an error f returns is printed as one line
// (Line) to stderr before the process exits with Code. Progress f prints on stdout stays.
func Command(cmd *cobra.Command, args cobra.PositionalArgs, f caddycmd.CommandFunc) {
	// Arguments are checked in RunE, not by cobra, so that a wrong count is our usage
	// error rather than cobra's "Error: ..." with exit status 1.
	cmd.Args = cobra.ArbitraryArgs
	// Not the footer Caddy's root command gives every command, which points at Caddy's.
	cmd.SetHelpTemplate(DefaultHelpTemplate + "\n" + DocsFooter)
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		finish(c.ErrOrStderr(), withUsage(c, err), ExitUsage)
		return err
	})
	cmd.RunE = func(c *cobra.Command, a []string) error {
		if args != nil {
			if err := args(c, a); err != nil {
				finish(c.ErrOrStderr(), withUsage(c, err), ExitUsage)
				return err
			}
		}
		status, err := f(caddycmd.Flags{FlagSet: c.Flags()})
		if code := Code(status, err); code != ExitOK {
			finish(c.ErrOrStderr(), err, code)
		}
		return nil
	}
}

// withUsage adds the command's usage line to an argument or flag error.
func withUsage(c *cobra.Command, err error) error {
	return fmt.Errorf("%v (usage: %s)", err, c.UseLine())
}

func finish(w io.Writer, err error, code int) {
	if err != nil {
		fmt.Fprintln(w, Line(err))
	}
	exit(code)
}
