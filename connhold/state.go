package connhold

// connState is a held connection's lifecycle. One writer: setStateLocked, with the
// connection's mu held.
type connState uint8

const (
	// stateOpen: the socket is up; frames are read (or the fd is parked) and sent.
	stateOpen connState = iota
	// stateClosing: the box sent (queued) its close frame; the socket ends once it is written.
	stateClosing
	// stateGone: the socket is closed; events (the close event last) may still be pending
	// for the instance, and acknowledged messages wait for a checkpoint.
	stateGone
	// stateDone: nothing pending; the connection has left the hub.
	stateDone
)

func (s connState) String() string {
	switch s {
	case stateOpen:
		return "open"
	case stateClosing:
		return "closing"
	case stateGone:
		return "gone"
	case stateDone:
		return "done"
	}
	return "unknown"
}

// connTransitions is every allowed move; anything else is refused.
var connTransitions = map[connState][]connState{
	stateOpen:    {stateClosing, stateGone},
	stateClosing: {stateGone},
	stateGone:    {stateDone},
}

func allowed(from, to connState) bool {
	for _, s := range connTransitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// setStateLocked moves c to s if the table allows it, and reports whether it did.
func (c *Conn) setStateLocked(s connState) bool {
	if !allowed(c.state, s) {
		return false
	}
	c.state = s
	c.room.Broadcast() // a delivery waiting for its client to catch up stops waiting
	return true
}
