// Package docs holds the gateway's documentation, and the test that keeps it honest.
//
// The Markdown beside this file is the documentation; the test checks it against the config
// schema, the metrics the gateway registers and the repository's files (see contributing.md,
// "The docs test").
package docs
