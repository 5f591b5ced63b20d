package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
)

// The command line, as the tools operators already know shape it: `gateway help [command]`
// and `-h` print help on standard output and exit 0; a usage error prints one line on
// standard error, pointing to the help, and exits 2; a failure at run time (an answer of the
// server, a store that does not answer) exits 1.

const mainUsage = `Usage:
  gateway -config FILE [-dev]                     run the gateway
  gateway -config FILE -check-config [-strict]    validate its config, print the start's warnings
  gateway keys generate|add|rotate|revoke|list ... manage API keys in the config's store
  gateway quota grant|override|end|reset|audit|overrides ...
                                                  change a tenant's quota through the admin API
  gateway usage top|show|history ...              read usage through the admin API
  gateway notifications test ...                  send a signed ping to a webhook endpoint
  gateway version                                 print the version (also: gateway -version)
  gateway help [command]                          this help, or a command's (keys, quota, usage,
                                                  notifications)

Flags of the gateway itself:
  -config FILE     the YAML config file (see config.example.yaml)
  -check-config    validate the config file (routes and limits compiled, the keys file read),
                   print every warning a start would log, and exit
  -strict          with -check-config: exit 2 when there is a warning (for CI)
  -dev             readable console logs at debug level, for development
  -version         print the version and exit

Exit codes: 0 success; 1 a failure at run time (an error answer of the admin API, a store
that does not answer); 2 a usage or config error, found before any request is sent.
`

const versionUsage = `Usage:
  gateway version
  gateway -version

Prints "gateway VERSION (GO VERSION)" on standard output.
`

// helpTopics are the texts `gateway help TOPIC` prints.
var helpTopics = map[string]string{
	"keys":          keysUsage,
	"quota":         quotaUsage,
	"usage":         usageUsage,
	"notifications": notificationsUsage,
	"version":       versionUsage,
	"help":          mainUsage,
}

// runMain dispatches the process's arguments to the command they name.
func runMain(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := ""
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "keys":
		return runKeys(ctx, args[1:], stdin, stdout, stderr)
	case "quota":
		return runQuota(ctx, args[1:], getenv, stdout, stderr)
	case "usage":
		return runUsage(ctx, args[1:], getenv, stdin, stdout, stderr)
	case "notifications":
		return runNotifications(ctx, args[1:], stdout, stderr)
	case "help":
		return runHelp(args[1:], stdout, stderr)
	case "version":
		if len(args) == 2 && slices.Contains([]string{"-h", "-help", "--help"}, args[1]) {
			fmt.Fprint(stdout, versionUsage)
			return exitOK
		}
		if len(args) > 1 {
			return usageError(stderr, "version", "gateway version takes no argument")
		}
		printVersion(stdout)
		return exitOK
	}
	return run(ctx, args, stdout, stderr)
}

// runHelp is `gateway help [command]`.
func runHelp(args []string, stdout, stderr io.Writer) int {
	switch len(args) {
	case 0:
		fmt.Fprint(stdout, mainUsage)
		return exitOK
	case 1:
		text, ok := helpTopics[args[0]]
		if !ok {
			return usageError(stderr, "", "no help for %q: the commands are keys, quota, usage, notifications and version", printable(clipArg(args[0])))
		}
		fmt.Fprint(stdout, text)
		return exitOK
	}
	return usageError(stderr, "", "gateway help takes at most one command")
}

func printVersion(w io.Writer) {
	fmt.Fprintf(w, "gateway %s (%s, commit %s)\n", version, runtime.Version(), buildRevision())
}

// usageError prints one line, "gateway: MESSAGE; see 'gateway help TOPIC'", and returns the
// usage exit code. topic "" points to the top-level help.
func usageError(stderr io.Writer, topic, format string, a ...any) int {
	see := "gateway help"
	if topic != "" {
		see += " " + topic
	}
	msg := strings.ReplaceAll(fmt.Sprintf(format, a...), "\n", " ")
	fmt.Fprintf(stderr, "gateway: %s; see '%s'\n", msg, see)
	return exitUsage
}

// subcommand splits "COMMAND SUB ARGS..." for the command topic, whose subcommands are subs.
// When done is true the command is over and code is its exit code: help was asked for
// (printed on stdout, 0) or the subcommand is missing or unknown (one line, 2).
func subcommand(args []string, topic string, subs []string, stdout, stderr io.Writer) (sub string, rest []string, code int, done bool) {
	want := strings.Join(subs[:len(subs)-1], ", ") + " or " + subs[len(subs)-1]
	if len(args) == 0 {
		return "", nil, usageError(stderr, topic, "gateway %s needs a command: %s", topic, want), true
	}
	switch sub = args[0]; sub {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, helpTopics[topic])
		return "", nil, exitOK, true
	}
	if !slices.Contains(subs, sub) {
		return "", nil, usageError(stderr, topic, "unknown command %q: want %s", printable(clipArg(sub)), want), true
	}
	return sub, args[1:], 0, false
}

// newFlagSet is a flag set that prints nothing itself: its caller prints the help on
// standard output (-h) or one line for a bad flag (parseCommand).
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseCommand parses a command's flags (anywhere among its arguments) and returns its
// positional arguments. When done is true the command is over and code is its exit code:
// help was asked for (printed on stdout, 0) or a flag was wrong (one line, 2).
func parseCommand(fs *flag.FlagSet, args []string, topic string, stdout, stderr io.Writer) (positional []string, code int, done bool) {
	positional, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, helpTopics[topic])
		return nil, exitOK, true
	}
	if err != nil {
		return nil, usageError(stderr, topic, "%s", flagMessage(err)), true
	}
	return positional, 0, false
}

// flagMessage is the flag package's error, in the words of the rest of the CLI.
func flagMessage(err error) string {
	s := err.Error()
	if name, ok := strings.CutPrefix(s, "flag provided but not defined: "); ok {
		return "unknown flag " + printable(clipArg(name))
	}
	return printable(s)
}

// clipArg shortens an argument echoed in an error line.
func clipArg(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// isTerminal says whether r is a terminal (a prompt is then useful).
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
