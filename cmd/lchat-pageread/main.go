// Command lchat-pageread reads an isolated space's SQLite databases' pages, under the
// space's uid, and streams them to the box over its stdin and stdout (the wire of
// spacestore/pageread): a crafted file then attacks this process, with the space's
// privileges and a memory bound, not the box. A checkpoint starts one per database for one
// view; the log keeps one per awake space, which serves views in turn and keeps a SQLite
// connection per database between them until the box closes its stdin. It is small on
// purpose (no Caddy): it starts in a few milliseconds. See docs/parsers.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

func main() {
	maxMemory := flag.Int64("max-memory", 0, "address-space limit in bytes (RLIMIT_AS); 0 keeps the inherited one")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: lchat-pageread [-max-memory bytes] (run by lchat-caddy; speaks on stdin/stdout)")
		os.Exit(2)
	}
	// The limit is set before a byte of the database is read: the box cannot set it on a
	// process of another uid without CAP_SYS_RESOURCE, and until the first request this
	// process runs only its own code.
	if *maxMemory > 0 {
		lim := &unix.Rlimit{Cur: uint64(*maxMemory), Max: uint64(*maxMemory)}
		if err := unix.Setrlimit(unix.RLIMIT_AS, lim); err != nil {
			fmt.Fprintf(os.Stderr, "lchat-pageread: setting the memory limit: %v\n", err)
			os.Exit(1)
		}
		debug.SetMemoryLimit(*maxMemory / 8) // a soft goal for the heap, well below the address space
	}
	if err := pageread.Serve(context.Background(), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "lchat-pageread: %v\n", err)
		os.Exit(1)
	}
}
