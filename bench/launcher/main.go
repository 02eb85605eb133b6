// Command launcher starts the processes the benchmark harness measures
// (see package launch); it is built and run by the harness, not by hand.
package main

import (
	"os"

	"github.com/keysync/confd/bench/launch"
)

func main() { launch.Serve(os.Stdin, os.Stdout) }
