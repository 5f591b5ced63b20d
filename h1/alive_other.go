//go:build !unix

package h1

import "net"

// prober cannot peek without blocking here: a connection the upstream closed while idle fails
// its next request instead.
type prober struct{}

func newProber(net.Conn) *prober { return nil }

func (*prober) check() idleState { return idleOpen }
