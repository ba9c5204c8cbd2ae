package demospace

import "time"

// clock is the time source of a Server: the real one in production, a
// driven one in tests (reminder timers, keepalive tickers).
type clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) timer
	NewTicker(d time.Duration) ticker
}

type timer interface {
	Stop() bool
}

type ticker interface {
	C() <-chan time.Time
	Stop()
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }
func (realClock) NewTicker(d time.Duration) ticker          { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

// Interface guards
var _ clock = realClock{}
