package box

import (
	"errors"
	"fmt"
	"net/http"
)

// Error is a refused or failed change with the answer it deserves, whichever door it
// came through: Status is the HTTP status the admin and peer APIs answer (the console
// shows the message). Its message is said to the caller as is.
type Error struct {
	Status int
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// fail is an Error of status with a formatted message (%w wraps).
func fail(status int, format string, args ...any) error {
	return &Error{Status: status, Err: fmt.Errorf(format, args...)}
}

// StatusOf is the HTTP status an error of this package deserves: its Error's, else 500.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return http.StatusInternalServerError
}

// Interface guards
var _ error = (*Error)(nil)
