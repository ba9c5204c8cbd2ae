// Command xcaddybuild builds lchat-caddy with xcaddy from the xcaddy.json manifest.
//
//	go run ./internal/xcaddybuild/cmd [-manifest xcaddy.json] [-xcaddy path] [-output file]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/lchat/lchat-caddy/internal/xcaddybuild"
)

func main() {
	manifest := flag.String("manifest", "xcaddy.json", "the build manifest")
	xcaddy := flag.String("xcaddy", "", "xcaddy binary (default: built from tools/go.mod)")
	output := flag.String("output", "", "output binary (default: the manifest's output)")
	flag.Parse()

	m, err := xcaddybuild.Load(*manifest)
	if err != nil {
		fail(err)
	}
	dir, err := filepath.Abs(filepath.Dir(*manifest))
	if err != nil {
		fail(err)
	}
	args := m.Args(dir, *output, nil)
	name, cmdArgs := *xcaddy, args
	if name == "" {
		name = "go"
		cmdArgs = append([]string{"tool", "-modfile=" + filepath.Join(dir, "tools", "go.mod"), "xcaddy"}, args...)
	}
	fmt.Fprintf(os.Stderr, "xcaddybuild: %s %v\n", name, cmdArgs)
	proxyDir, err := os.MkdirTemp("", "xcaddybuild-proxy")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(proxyDir)
	env, err := m.Env(os.Environ(), dir, proxyDir, nil)
	if err != nil {
		fail(err)
	}
	cmd := exec.Command(name, cmdArgs...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		os.RemoveAll(proxyDir)
		fail(fmt.Errorf("running xcaddy: %v", err))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "xcaddybuild:", err)
	os.Exit(1)
}
