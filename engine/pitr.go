package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/lchat/lchat-caddy/spacestore"
)

// ErrAwake means a point-in-time restore was refused because the space is awake (on this box,
// or, as a *LeaseHeldError, on another).
var ErrAwake = errors.New("space is awake: put it to sleep before restoring")

// History lists host's checkpoints, oldest first, each with the log that extends it
// (spacestore.Timeline): every point a restore can bring back.
func (e *Engine) History(ctx context.Context, host string) ([]spacestore.Checkpoint, error) {
	if !validHost(host) {
		return nil, fmt.Errorf("invalid host %q", host)
	}
	cps, _, err := spacestore.Timeline(ctx, e.cfg.Bucket, host)
	return cps, err
}

// RestoreTo makes the state t names (a checkpoint, or the newest acknowledged state at or
// before a time: a checkpoint plus its log's segments, spacestore.RestoreToWith) of the
// asleep space host its current state, as a new generation, within the retention of kind
// (DefaultRetention when the kind sets none). A restore that applies segments rebuilds the
// state under the state dir (pitr/), which needs room for the space. It
// holds the space's operation lock, so this box cannot wake it meanwhile; a space awake here
// is refused with ErrAwake, one awake on another box with a *LeaseHeldError. Nothing is
// written when refused.
func (e *Engine) RestoreTo(ctx context.Context, host, kind string, t spacestore.Target) (spacestore.RestoreResult, error) {
	if !validHost(host) {
		return spacestore.RestoreResult{}, fmt.Errorf("invalid host %q", host)
	}
	if e.life.Fenced() {
		return spacestore.RestoreResult{}, errFencedNoWrite
	}
	k, _ := e.kind(kind)
	in := e.get(host)
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	state, holding := in.state, in.leaseETag != ""
	in.mu.Unlock()
	if holding || (state != StateAsleep && state != StateFailed && state != StateFenced) {
		return spacestore.RestoreResult{}, ErrAwake
	}
	opts := spacestore.RestoreOptions{Retention: k.Retention, WorkDir: filepath.Join(e.cfg.StateDir, "pitr"),
		SealLog: k.Durability.Logs()}
	res, err := spacestore.RestoreToWith(ctx, e.cfg.Bucket, host, e.holder, t, opts, e.now())
	var held *spacestore.LeaseHeldError
	if errors.As(err, &held) {
		return res, &LeaseHeldError{Holder: held.Holder}
	}
	return res, err
}
