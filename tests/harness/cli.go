package harness

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"
)

// CLIRun is one run of an lchat-caddy command: what it wrote to stdout and to stderr,
// apart, and its exit code.
type CLIRun struct {
	Stdout, Stderr string
	Code           int
}

// RunCLI runs the real lchat-caddy with args in dir (a new temporary directory when
// empty), with HOME and XDG directories of its own, PATH, and env, and returns what it
// printed and its exit code.
func RunCLI(t testing.TB, dir string, env []string, args ...string) CLIRun {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, Binary(t), args...)
	cmd.Dir = dir
	home := t.TempDir()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_DATA_HOME=" + home, "XDG_CONFIG_HOME=" + home}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := CLIRun{Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running lchat-caddy %v: %v", args, err)
	}
	return r
}

// CLIRun runs an lchat-caddy subcommand against this box (with --address appended), in
// the box's directory and environment, and returns its output and exit code apart.
func (b *Box) CLIRun(args ...string) CLIRun {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.bin, append(args, "--address", b.AdminAddr)...)
	cmd.Dir = b.Dir
	cmd.Env = b.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := CLIRun{Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		b.t.Fatalf("running lchat-caddy %v: %v", args, err)
	}
	return r
}
