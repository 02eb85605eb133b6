package cmdkit

import (
	"context"
	"errors"
)

// SplitErrors undoes errors.Join, one level, so each problem gets its own line.
func SplitErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// Interrupted reports whether ctx ended by a signal (canceled), not by a
// deadline.
func Interrupted(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.Canceled)
}
