package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/umbp-go/umbp-go/internal/endpoint"
	"github.com/umbp-go/umbp-go/umbp"
)

// helpText is what a command returns when asked for help (-h): run prints
// text on standard output and exits 0.
type helpText struct{ text string }

func (h *helpText) Error() string { return "help requested" }

// parseFlags parses args into fs, which prints nothing itself: a flag
// error comes back as a usage error with the flag package's words, and -h
// as flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return err
	}
	return fmt.Errorf("%w: %w", errUsage, err)
}

// flagHelp writes the flags of fs named in names (all of them when names
// is nil), as flag.PrintDefaults does.
func flagHelp(fs *flag.FlagSet, names []string) string {
	var b strings.Builder
	sub := flag.NewFlagSet("", flag.ContinueOnError)
	sub.SetOutput(&b)
	fs.VisitAll(func(f *flag.Flag) {
		if names != nil && !slices.Contains(names, f.Name) {
			return
		}
		sub.Var(f.Value, f.Name, f.Usage)
		sub.Lookup(f.Name).DefValue = f.DefValue
	})
	sub.PrintDefaults()
	return b.String()
}

// share registers every flag of src on dst as well, with the same value:
// flags given before a subcommand and after it land in the same place.
func share(dst, src *flag.FlagSet) {
	src.VisitAll(func(f *flag.Flag) {
		dst.Var(f.Value, f.Name, f.Usage)
		dst.Lookup(f.Name).DefValue = f.DefValue
	})
}

// onlyFlags refuses, as a usage error, every flag set on fs that is not
// among allowed: what a command cannot use is refused, not ignored. where
// names the command, or the mode, that cannot use them.
func onlyFlags(fs *flag.FlagSet, allowed []string, where string) error {
	var other []string
	fs.Visit(func(f *flag.Flag) {
		if !slices.Contains(allowed, f.Name) {
			other = append(other, "-"+f.Name)
		}
	})
	switch len(other) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%w: %s does not apply %s", errUsage, other[0], where)
	}
	return fmt.Errorf("%w: %s do not apply %s", errUsage, strings.Join(other, ", "), where)
}

// configFlags names, for each field of the library's configurations that
// an error of NewStandaloneRuntime or NewClusterRuntime can name, the flag
// that sets it.
var configFlags = []struct{ field, flag string }{
	{"ClusterConfig.Masters", "-master"},
	{"ClusterConfig.LookupTimeout", "-timeout"},
	{"ClusterConfig.StartupTimeout", "-timeout"},
	{"ClusterConfig.Timeout", "-timeout"},
	{"Config.Endpoint", "-endpoint"},
	{"Config.TrustedUIDs", "-trust-uid"},
	{"Config.NumWorkers", "-workers"},
	{"Config.LookupTimeout", "-timeout"},
	{"Config.StartupTimeout", "-timeout"},
	{"Config.Timeout", "-timeout"},
}

// inFlagWords returns the text of an error of the library in the tool's
// words: a configuration error names the flag that fixes it instead of the
// field of umbp.Config, and an untrusted server the -trust-uid that would
// trust it.
func inFlagWords(err error) string {
	text := said(strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
	if errors.Is(err, umbp.ErrInvalidConfig) {
		text = strings.TrimPrefix(text, "invalid configuration: ")
		for _, m := range configFlags {
			text = strings.ReplaceAll(text, m.field, m.flag)
		}
	}
	text = fieldWords.Replace(text)
	if errors.Is(err, umbp.ErrUntrustedServer) {
		if m := untrustedUID.FindStringSubmatch(text); m != nil {
			text += fmt.Sprintf(" (if uid %s runs your server, pass -trust-uid %s)", m[1], m[1])
		}
	}
	return text
}

// envSource names, for a flag whose default comes from the environment,
// the variable its value came from when it was not given ("" when none
// did): -endpoint from $UMBP_ENDPOINT, or from $UMBP_NODE_ID, which names
// the default socket; -master from $UMBP_MASTER_ADDRESS.
func envSource(flagName, value string) string {
	switch flagName {
	case "endpoint":
		if v := os.Getenv("UMBP_ENDPOINT"); v != "" {
			if v == value {
				return "UMBP_ENDPOINT"
			}
		} else if os.Getenv("UMBP_NODE_ID") != "" && value == endpoint.Default() {
			return "UMBP_NODE_ID"
		}
	case "master":
		if v := os.Getenv("UMBP_MASTER_ADDRESS"); v != "" && v == value {
			return "UMBP_MASTER_ADDRESS"
		}
	}
	return ""
}

// withEnvSource says, in an error's text that names a flag of fs that was
// not given and took its value from the environment, where that value
// came from: a mistyped $UMBP_ENDPOINT is fixed in the environment, not
// on a command line that has no -endpoint.
func withEnvSource(text string, fs *flag.FlagSet) string {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range []string{"endpoint", "master"} {
		f := fs.Lookup(name)
		if f == nil || given[name] || !strings.Contains(text, "-"+name) {
			continue
		}
		env := envSource(name, f.Value.String())
		if env == "" {
			continue
		}
		// "-endpoint (or $UMBP_ENDPOINT)" is said again in place; other
		// texts get it at their end.
		if either := fmt.Sprintf("-%s (or $%s)", name, env); strings.Contains(text, either) {
			text = strings.Replace(text, either, fmt.Sprintf("$%s (where this value came from) or -%s", env, name), 1)
		} else {
			what := "the value of $" + env
			if env == "UMBP_NODE_ID" {
				what = "the default socket of $UMBP_NODE_ID"
			}
			text += fmt.Sprintf(" (%s: -%s was not given)", what, name)
		}
	}
	return text
}

// fieldWords are the library's words, outside a configuration error, for
// the fields the tool sets from its flags: the end of a wait, and what to
// check when a socket is missing.
var fieldWords = strings.NewReplacer(
	"the wait's end: StartupTimeout,", "the wait's end: -timeout,",
	"check Endpoint for a typo", "check -endpoint for a typo",
)

// untrustedUID finds the uid an untrusted server's socket or process
// belongs to in the library's refusal.
var untrustedUID = regexp.MustCompile(`(?:owned by|runs as) uid (\d+), not `)
