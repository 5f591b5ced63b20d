package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/notify"
)

const notificationsUsage = `Usage:
  gateway notifications test -config FILE --endpoint NAME

test sends one signed ping event to the webhook endpoint NAME of the config's
notifications.webhooks, now and once (no outbox, no retry), and prints the endpoint's
answer: its status and up to 4 KiB of its body.

Exit codes: 0 the endpoint answered 2xx; 1 it answered otherwise, or not within
notifications.timeout; 2 a usage or config error.
`

// runNotifications is `gateway notifications test`.
func runNotifications(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	_, args, code, done := subcommand(args, "notifications", []string{"test"}, stdout, stderr)
	if done {
		return code
	}
	fs := newFlagSet("gateway notifications test")
	configPath := fs.String("config", "", "path to the gateway's YAML config file")
	endpoint := fs.String("endpoint", "", "name of the webhook endpoint (notifications.webhooks[].name)")
	positional, code, done := parseCommand(fs, args, "notifications", stdout, stderr)
	if done {
		return code
	}
	switch {
	case len(positional) > 0:
		return usageError(stderr, "notifications", "unexpected argument %q", printable(clipArg(positional[0])))
	case *configPath == "":
		return usageError(stderr, "notifications", "-config FILE is required")
	case *endpoint == "":
		return usageError(stderr, "notifications", "--endpoint NAME is required")
	}
	cfg, err := config.Load(*configPath, os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "gateway notifications: %v\n", err)
		return exitUsage
	}
	var names []string
	var ep *notify.Endpoint
	for _, w := range cfg.Notifications.Webhooks {
		names = append(names, w.Name)
		if w.Name == *endpoint {
			ep = &notify.Endpoint{Name: w.Name, URL: w.URL, Keys: w.Keys, AllowPrivate: w.AllowPrivateAddresses}
		}
	}
	if ep == nil {
		if len(names) == 0 {
			return usageError(stderr, "notifications", "%s has no notifications.webhooks", *configPath)
		}
		return usageError(stderr, "notifications", "no webhook endpoint %q: the config names %s", printable(clipArg(*endpoint)), strings.Join(names, ", "))
	}
	ev := notify.Event{Type: config.EventPing, ID: notify.NewID(), Time: time.Now().UTC(), Data: map[string]string{"endpoint": ep.Name}}
	body, err := json.Marshal(ev)
	if err != nil {
		fmt.Fprintf(stderr, "gateway notifications: %v\n", err)
		return exitFailure
	}
	n := notify.New(notify.NewMemory(1), nil, notify.Options{Timeout: cfg.Notifications.Timeout})
	a := n.Send(ctx, ep, ev.ID, body)
	if a.Err != nil {
		fmt.Fprintf(stderr, "gateway notifications: %s: %s\n", ep.Name, printable(a.Err.Error()))
		return exitFailure
	}
	fmt.Fprintf(stdout, "%s answered %d in %s to ping %s\n", ep.Name, a.Status, a.Latency.Round(time.Millisecond), ev.ID)
	if len(a.Body) > 0 {
		fmt.Fprintln(stdout, printable(string(a.Body)))
	}
	if !a.OK() {
		return exitFailure
	}
	return exitOK
}
