// Command lchat-demo-space is the demo space on its own, without Caddy: a binary whose
// start costs what a small Go program's does (a few ms, not the 571 package inits of
// lchat-caddy), so a wake is not the app's start-up. `lchat-caddy demo-space` runs the
// same code. The shipped configs use this binary when it is installed next to
// lchat-caddy ({demo_space}).
package main

import (
	"fmt"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lchat/lchat-caddy/demospace"
)

func main() {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	logger := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(os.Stderr), zapcore.InfoLevel)).Named("demo_space")
	defer logger.Sync()
	if err := demospace.Main(os.Args[1:], os.Stderr, logger); err != nil {
		fmt.Fprintln(os.Stderr, "lchat-demo-space:", err)
		os.Exit(1)
	}
}
