package lchat

import (
	"os"
	"time"

	"go.uber.org/zap"
)

// envTestClockOffset shifts this box's wall clock as the mesh sees it, for tests that run
// boxes whose clocks disagree (tests/meshe2e). Test-only: never set it on a real box.
const envTestClockOffset = "LCHAT_TEST_CLOCK_OFFSET"

// testWallClock is the wall clock of the membership: time.Now (nil), or time.Now shifted
// by LCHAT_TEST_CLOCK_OFFSET.
func testWallClock(logger *zap.Logger) func() time.Time {
	raw := os.Getenv(envTestClockOffset)
	if raw == "" {
		return nil
	}
	d, err := time.ParseDuration(raw)
	if err != nil {
		logger.Warn("ignoring "+envTestClockOffset, zap.Error(err))
		return nil
	}
	logger.Warn("test-only clock offset in effect", zap.Duration("offset", d))
	return func() time.Time { return time.Now().Add(d) }
}
