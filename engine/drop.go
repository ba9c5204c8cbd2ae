package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Remove is the removal of a route: the space's latest state is saved first (stop,
// checkpoint, release the lease: a sleep), then its scheduled wake record and its local
// state are deleted; its bucket data stays, so a re-created route finds every write
// acknowledged before the removal. When the checkpoint cannot be made (a bucket error,
// a fenced box) the local state is kept and an error returned: a removal never loses
// writes silently. Discard is the separate choice of dropping unsaved state. Remove
// deletes the wake record even when this engine never ran the space.
func (e *Engine) Remove(ctx context.Context, host string) error {
	in := e.lookup(host)
	if in == nil {
		if validHost(host) {
			e.setWakeRecord(ctx, host, nil)
		}
		return nil
	}
	in.mu.Lock()
	t := in.trans
	in.mu.Unlock()
	if t != nil { // a wake or sleep in flight: let it finish, then save what it left
		select {
		case <-t.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := e.sleep(ctx, in, "removed"); err != nil {
		return fmt.Errorf("saving the space before removal (local state kept): %w", err)
	}
	if err := e.flushDirty(ctx, in); err != nil {
		return fmt.Errorf("saving the space before removal (local state kept): %w", err)
	}
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	state := in.state
	in.mu.Unlock()
	switch state {
	case StateHeld, StateRechecking, StateUnsaved:
		return errors.New("saving the space before removal: box fenced or checkpoint failed; local state kept and saved once the bucket is reachable")
	case StateAwake, StateWaking:
		return errors.New("space woke again during its removal; local state kept")
	case StateDropped:
		return nil // removed meanwhile
	}
	return e.dropOpHeld(ctx, in)
}

// Discard is the explicit choice of dropping a space without saving it: it stops the
// instance, releases its lease, deletes its scheduled wake record and its local state.
// Writes since the last checkpoint are lost; the bucket data stays as it was.
func (e *Engine) Discard(ctx context.Context, host string) error {
	in := e.lookup(host)
	if in == nil {
		if validHost(host) {
			e.setWakeRecord(ctx, host, nil)
		}
		return nil
	}
	in.op.Lock()
	defer in.op.Unlock()
	e.stopOpHeld(ctx, in, stopSpec{reason: "discard", outcome: stopDiscard})
	in.mu.Lock()
	dropped := in.state == StateDropped
	in.mu.Unlock()
	if dropped {
		return nil
	}
	return e.dropOpHeld(ctx, in)
}

// dropOpHeld (in.op held, the space not running) releases the lease if still held, deletes
// the scheduled wake record and forgets the space's local state.
//
// The inst moves to StateDropped first and leaves the engine's map last, once its socket and
// state directories are gone: a new inst for the host (a re-created route) is made only
// after that, so nothing of this one's cleanup can remove what the new one made, and an
// Acquire that held this inst waits for the drop and then takes the new one.
func (e *Engine) dropOpHeld(ctx context.Context, in *inst) error {
	if !e.life.Fenced() {
		e.releaseLease(in)
	}
	e.setWakeRecord(ctx, in.host, nil)
	in.mu.Lock()
	in.proc = nil
	err := in.setStateLocked(StateDropped)
	in.mu.Unlock()
	if err != nil {
		return err
	}
	os.RemoveAll(filepath.Dir(in.socket))
	in.unpinSocket()
	in.mu.Lock()
	if in.logw != nil {
		in.logw.Close()
		in.logw = nil
	}
	in.mu.Unlock()
	// The disk first: its mounts sit inside in.dir.
	err = e.removeDisk(in)
	if rerr := os.RemoveAll(in.dir); err == nil {
		err = rerr
	}
	e.mu.Lock()
	if e.spaces[in.host] == in {
		delete(e.spaces, in.host)
	}
	e.mu.Unlock()
	if err != nil {
		return fmt.Errorf("removing local state: %v", err)
	}
	return nil
}
