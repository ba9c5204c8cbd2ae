package demospace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// WakeReasonHeader carries why the proxy woke the space; "scheduled" means
// the time the space left in next-wake has come.
const WakeReasonHeader = "X-Lchat-Wake-Reason"

// NextWakePath is where, relative to the data directory, the space leaves the
// RFC 3339 time it wants to be woken at.
var NextWakePath = filepath.Join(".lchat", "next-wake")

// startupGrace is how long, after start, reminders that are already due wait
// for the proxy's scheduled-wake POST before the in-process timer fires them
// anyway: the wake that started us should be the one that delivers them.
const startupGrace = 5 * time.Second

// writeNextWake atomically replaces dataDir/.lchat/next-wake with at, or
// removes it when ok is false. The file holds exactly one RFC 3339 time with
// no trailing newline.
func writeNextWake(dataDir string, at time.Time, ok bool) error {
	path := filepath.Join(dataDir, NextWakePath)
	if !ok {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing next-wake: %v", err)
		}
		return nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing next-wake: %v", err)
	}
	f, err := os.CreateTemp(dir, ".next-wake-*")
	if err != nil {
		return fmt.Errorf("writing next-wake: %v", err)
	}
	tmp := f.Name()
	_, err = f.WriteString(at.UTC().Format(time.RFC3339))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing next-wake: %v", err)
	}
	return nil
}

// rescheduleLocked brings next-wake and the in-process reminder timer in line
// with the database. s.writeMu must be held.
func (s *Server) rescheduleLocked(ctx context.Context) error {
	next, ok, err := s.store.nextReminder(ctx)
	if err != nil {
		return err
	}
	if err := writeNextWake(s.dataDir, next, ok); err != nil {
		return err
	}
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if !ok {
		return nil
	}
	fireAt := next
	if earliest := s.started.Add(startupGrace); fireAt.Before(earliest) {
		fireAt = earliest
	}
	s.timer = s.clock.AfterFunc(fireAt.Sub(s.clock.Now()), s.timerFired)
	return nil
}

// timerFired delivers reminders that fall due while the space is awake.
func (s *Server) timerFired() {
	safego.Run(s.logger, "reminder timer", s.fireDueNow)
}

func (s *Server) fireDueNow() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.fireDue(ctx); err != nil && !errors.Is(err, errClosed) {
		s.logger.Error("firing reminders", zap.Error(err))
	}
}

// fireDue posts every due reminder into the chat and rewrites next-wake.
func (s *Server) fireDue(ctx context.Context) ([]Message, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	posted, err := s.store.fireDue(ctx, s.clock.Now())
	if err != nil {
		return nil, err
	}
	s.hub.publish(posted...)
	if err := s.rescheduleLocked(ctx); err != nil {
		return posted, err
	}
	return posted, nil
}
