// Package docs holds the gateway's documentation (Markdown beside this file) and no code: its
// test keeps the documentation honest against the config schema, the metrics the gateway
// registers and the repository's files (see contributing.md, "The docs test").
package docs
