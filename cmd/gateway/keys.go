package main

import (
	"context"
	"fmt"
	"io"
)

// runKeys is the `gateway keys` subcommand: add, revoke and list registered keys.
func runKeys(_ context.Context, _ []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "gateway keys: not implemented yet")
	return exitUsage
}
