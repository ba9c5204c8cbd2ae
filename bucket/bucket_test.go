package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
)

func TestLostRace(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"precondition", bucket.ErrPreconditionFailed, true},
		{"conflict", bucket.ErrConflict, true},
		{"wrapped precondition", fmt.Errorf("s3bucket: put k: %w", bucket.ErrPreconditionFailed), true},
		{"wrapped conflict", fmt.Errorf("s3bucket: put k: %w (OperationAborted)", bucket.ErrConflict), true},
		{"not found", bucket.ErrNotFound, false},
		{"timeout: may have landed", context.DeadlineExceeded, false},
		{"other", errors.New("connection reset"), false},
	} {
		if got := bucket.LostRace(tc.err); got != tc.want {
			t.Errorf("%s: LostRace(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
