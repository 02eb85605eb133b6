package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The functions below take key values, which can be secrets: their errors
// say what is wrong with the value without quoting it (strconv quotes the
// whole input; encoding/json quotes the offending character).

// atoi is strconv.Atoi without the value in its error.
func atoi(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, numError("atoi", "an integer", len(s), err)
	}
	return n, nil
}

// parseBool is strconv.ParseBool without the value in its error.
func parseBool(s string) (bool, error) {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, numError("parseBool", "a boolean", len(s), err)
	}
	return b, nil
}

func numError(fn, want string, n int, err error) error {
	if ne, ok := errors.AsType[*strconv.NumError](err); ok {
		err = ne.Err
	}
	return fmt.Errorf("%s: value (%d bytes, not shown) is not %s: %w", fn, n, want, err)
}

// jsonError keeps the position of a syntax error and the types of a type
// mismatch, neither of which is part of the value.
func jsonError(fn string, n int, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("%s: value (%d bytes, not shown) is not valid JSON: syntax error at byte %d", fn, n, se.Offset)
	case errors.As(err, &te):
		return fmt.Errorf("%s: value (%d bytes, not shown) holds a JSON %s where %s is expected", fn, n, te.Value, te.Type)
	default:
		return fmt.Errorf("%s: value (%d bytes, not shown) is not valid JSON", fn, n)
	}
}
