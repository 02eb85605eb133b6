package main

import (
	"os"
	"testing"

	"github.com/keysync/confd/internal/groupguard"
)

// TestMain lets this test binary be the commands' group guard, as confd
// is: the guard re-executes the running binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == groupguard.Arg {
		os.Exit(groupguard.Main("confd", os.Args[2:]))
	}
	os.Exit(m.Run())
}
