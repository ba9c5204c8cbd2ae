// Command printself prints how it names itself (selfcmd.Command) and where its binary is,
// for selfcmd's test of `go run`.
package main

import (
	"fmt"
	"os"

	"github.com/lchat/lchat-caddy/internal/selfcmd"
)

// nonce makes each test's build new (-ldflags -X main.nonce=...), so its first go run
// builds and its second runs Go's cached binary.
var nonce string

func main() {
	exe, _ := os.Executable()
	fmt.Printf("%s\n%s\n%s\n", selfcmd.Command(), exe, nonce)
}
