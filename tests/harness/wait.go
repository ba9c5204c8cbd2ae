package harness

import "github.com/lchat/lchat-caddy/internal/testwait"

// WaitFor is testwait.WaitFor, the one polling wait of the tests.
var WaitFor = testwait.WaitFor
