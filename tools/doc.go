// Package tools pins the repository's development tools (staticcheck, the
// protoc plugins: the tool block of its go.mod, run with go tool) and
// checks a release: its test lays the repository's modules out as a module
// proxy at their release version and installs, gets and builds them from
// it, as a user would (docs/RELEASING.md). This module is never published;
// no published module requires it.
package tools
