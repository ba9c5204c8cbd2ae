package connhold

import "time"

// Limits bounds what held connections may cost. Zero fields take their defaults.
type Limits struct {
	// MaxMessage is the largest client message, after reassembly of its fragments; a
	// larger one closes the connection with 1009. Default 1 MiB.
	MaxMessage int
	// MaxPending is the most client messages a connection keeps for the instance
	// (undelivered, and acknowledged but not yet covered by a checkpoint); one more closes
	// it with 1013. Default 1024.
	MaxPending int
	// MaxPendingBytes is the same bound in bytes. Default 4 MiB.
	MaxPendingBytes int
	// MaxBoxPendingBytes bounds the pending bytes of every connection of the box
	// together; a message past it closes its connection with 1013. Default 256 MiB.
	MaxBoxPendingBytes int64
	// MaxOutBytes is the most bytes queued towards one client behind the write in
	// progress (what it has not read); a message that would pass it makes the client a
	// slow reader: its queue is dropped and it is closed with 1008, its write in progress
	// and the close frame given a second (not WriteTimeout) before its socket ends. A
	// message that finds nothing queued is sent whatever its size. Default 1 MiB.
	MaxOutBytes int
	// MaxBoxOutBytes is the same bound for the whole box. Default 256 MiB.
	MaxBoxOutBytes int64
	// WriteTimeout bounds one write to a client; a client that takes no bytes for that
	// long is cut. Default 10s.
	WriteTimeout time.Duration
	// ParkAfter is how long a reader waits for more bytes before it parks the
	// connection in the epoll set and ends. Default 10ms.
	ParkAfter time.Duration
	// RetryFirst is the delay before an event the instance did not acknowledge is
	// delivered again; it doubles up to RetryMax. Defaults: redeliveryBackoff's (100ms, 5s).
	RetryFirst, RetryMax time.Duration
	// MaxAttempts is how many deliveries of one event may fail in a row before the
	// connection is closed with 1011 and its events dropped. Default 10.
	MaxAttempts int
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def64 := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	dur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxMessage, 1<<20)
	def(&l.MaxPending, 1024)
	def(&l.MaxPendingBytes, 4<<20)
	def64(&l.MaxBoxPendingBytes, 256<<20)
	def(&l.MaxOutBytes, 1<<20)
	def64(&l.MaxBoxOutBytes, 256<<20)
	dur(&l.WriteTimeout, 10*time.Second)
	dur(&l.ParkAfter, 10*time.Millisecond)
	dur(&l.RetryFirst, redeliveryBackoff.First)
	dur(&l.RetryMax, redeliveryBackoff.Max)
	def(&l.MaxAttempts, 10)
	return l
}
