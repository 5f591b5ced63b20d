package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
)

// adminTimeout bounds one CLI call to the admin API (`gateway quota`, `gateway usage`).
const adminTimeout = 15 * time.Second

// adminFlags are the flags every command that talks to the admin API takes; client (in
// adminclient.go) turns them into an adminClient. The admin token is read from
// GATEWAY_ADMIN_TOKEN or the -config file, never from the command line. A new command that
// talks to the admin API embeds adminFlags, calls register on its flag set (it then owns no
// -config flag of its own) and sends its request with call, or with client and do when it
// prints the answer itself.
type adminFlags struct {
	admin, config, cacert string
	asJSON                bool
}

// adminFlagsUsage is the help's paragraph on these flags, shared by the commands' help texts.
const adminFlagsUsage = `  -admin URL    the admin listener (default: the admin_listen of -config, else
                GATEWAY_ADMIN_URL, else http://127.0.0.1:9090)
  -config FILE  the gateway's config file: the admin listener's address and TLS (its own
                certificate is trusted), and its admin_token when GATEWAY_ADMIN_TOKEN is unset
  -cacert FILE  trust this CA for an https admin URL (PEM)
  -json         print the admin API's JSON answer as it came, instead of a line or a table
`

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.admin, "admin", "", "the admin listener's URL")
	fs.StringVar(&a.config, "config", "", "the gateway's config file (the admin listener's address, TLS and token)")
	fs.StringVar(&a.cacert, "cacert", "", "CA certificate (PEM) for an https admin URL")
	fs.BoolVar(&a.asJSON, "json", false, "print the JSON answer as it came")
}

// check validates -admin without the network; the rest is resolved by client.
func (a *adminFlags) check() error {
	if a.admin == "" {
		return nil
	}
	if u, err := url.Parse(a.admin); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-admin %q: want http://host:port or https://host:port", printable(clipArg(a.admin)))
	}
	return nil
}

// adminRequest is one request of a command to the admin API.
type adminRequest struct {
	method, path string
	body         any // JSON, or nil for none
}

// call sends r and prints its answer: the JSON as it came with -json, else through print. An
// error answer prints "gateway: CODE: MESSAGE" (adminClient.refusal) and exits 1, as does an
// admin listener that does not answer; a -config or -cacert that cannot be read exits 2.
func (a *adminFlags) call(ctx context.Context, r adminRequest, getenv func(string) string, stdout, stderr io.Writer, print func(io.Writer, []byte) error) int {
	c, err := a.client(getenv)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	status, data, err := c.do(ctx, r.method, r.path, r.body)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return exitFailure
	}
	if status >= 300 {
		fmt.Fprintf(stderr, "gateway: %s\n", c.refusal(status, data))
		return exitFailure
	}
	if a.asJSON {
		_, _ = stdout.Write(data)
		return exitOK
	}
	if err := print(stdout, data); err != nil {
		fmt.Fprintf(stderr, "gateway: reading the answer: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// clipAnswer keeps an error answer that is not the API's JSON (a proxy's HTML page) to one
// readable line.
func clipAnswer(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
