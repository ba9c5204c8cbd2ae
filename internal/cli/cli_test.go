package cli

import (
	"errors"
	"fmt"
	"testing"
)

func TestCode(t *testing.T) {
	base := errors.New("boom")
	for _, c := range []struct {
		name   string
		status int
		err    error
		want   int
	}{
		{"success", ExitOK, nil, ExitOK},
		{"a failure", ExitFailed, base, ExitFailed},
		{"an error with status 0", ExitOK, base, ExitFailed},
		{"bucket-check's verdict", ExitCheckFailed, nil, ExitCheckFailed},
		{"bad input", ExitFailed, Usage(base), ExitUsage},
		{"bad input, wrapped", ExitFailed, fmt.Errorf("adding: %w", Usagef("host %q", "X")), ExitUsage},
		{"unreachable", ExitFailed, Unreachable(base), ExitUnreachable},
	} {
		if got := Code(c.status, c.err); got != c.want {
			t.Errorf("%s: Code(%d, %v) = %d, want %d", c.name, c.status, c.err, got, c.want)
		}
	}
}

func TestLineIsOneLine(t *testing.T) {
	err := errors.New("route a.example.com updated,\nbut putting its space to sleep failed:\n\tcheckpoint: timeout\n")
	want := "Error: route a.example.com updated, but putting its space to sleep failed: checkpoint: timeout"
	if got := Line(err); got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
}
