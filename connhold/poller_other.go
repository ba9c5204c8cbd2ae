//go:build !linux

package connhold

import (
	"context"
	"errors"
)

// Parking needs epoll; elsewhere the hub cannot be made.
type poller struct{}

func newPoller() (*poller, error) { return nil, errors.New("holding connections needs Linux (epoll)") }

func (p *poller) park(c *Conn) error                               { return errors.ErrUnsupported }
func (p *poller) remove(c *Conn)                                   {}
func (p *poller) run(ctx context.Context, ready func(*Conn)) error { return nil }
func (p *poller) close()                                           {}
func (p *poller) release()                                         {}
