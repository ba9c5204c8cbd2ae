package derpswitch

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"tailscale.com/derp"
	"tailscale.com/types/key"
)

// scriptedConn is a Conn whose receives follow a script: an error per true, a message per
// false. Past the script it closes its slot and fails. It records when each receive
// was asked for.
type scriptedConn struct {
	sl     *slot
	script []bool
	start  time.Time
	at     []time.Duration
}

func (c *scriptedConn) RecvDetail() (derp.ReceivedMessage, int, error) {
	c.at = append(c.at, time.Since(c.start))
	i := len(c.at) - 1
	if i >= len(c.script) {
		c.sl.closed.Store(true)
		return nil, 0, errors.New("closed")
	}
	if c.script[i] {
		return nil, 0, errors.New("connection refused")
	}
	return derp.ServerInfoMessage{}, 1, nil
}

func (*scriptedConn) Connect(context.Context) error     { return nil }
func (*scriptedConn) Ping(context.Context) error        { return nil }
func (*scriptedConn) Send(key.NodePublic, []byte) error { return nil }
func (*scriptedConn) SendPong([8]byte) error            { return nil }
func (*scriptedConn) NotePreferred(bool)                {}
func (*scriptedConn) Close() error                      { return nil }

// TestReconnectBackoff: a slot whose connection keeps failing reconnects at once, then
// after 50ms, doubling to 5s (reconnectBackoff); a message received starts the curve
// over, so the next loss again reconnects at once.
func TestReconnectBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		s := &Switcher{ctx: ctx, pokeCh: make(chan struct{}, 1)}
		s.logp.Store(zap.NewNop())
		sl := &slot{sw: s, rxCh: make(chan struct{}, 1)}
		fail, ok := true, false
		c := &scriptedConn{sl: sl, start: time.Now(),
			script: []bool{fail, fail, fail, fail, fail, fail, fail, fail, fail, fail, ok, fail, fail}}
		sl.conn = c
		sl.recvLoop()

		const ms = time.Millisecond
		var want []time.Duration
		at := time.Duration(0)
		for _, wait := range []time.Duration{
			0, 0, 50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5000 * ms, 5000 * ms, // ten failures, then a message
			0,          // the message: the next receive at once
			0, 50 * ms, // the next loss reconnects at once, then backs off again
		} {
			at += wait
			want = append(want, at)
		}
		if !slices.Equal(c.at, want) {
			t.Errorf("receives at %v, want %v", c.at, want)
		}
	})
}
