// Command minimal is the machine's floor for a wake: the smallest Go HTTP server, which
// answers every request with "ok" on the listener passed as fd 3 (LISTEN_FDS=1), else on
// the Unix socket $LCHAT_SOCKET. tests/wake times its exec to first answer.
package main

import (
	"net"
	"net/http"
	"os"
)

func main() {
	var ln net.Listener
	var err error
	if os.Getenv("LISTEN_FDS") == "1" {
		ln, err = net.FileListener(os.NewFile(3, "http"))
	} else {
		ln, err = net.Listen("unix", os.Getenv("LCHAT_SOCKET"))
	}
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
}
