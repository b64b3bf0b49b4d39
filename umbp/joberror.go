package umbp

import (
	"errors"
	"fmt"
	"strings"
)

// jobError is what happened to a job that FAILED: every distinct key error,
// which errors.Is and errors.As see, and their text grouped: key faults of
// one cause (a miss, a refusal) as one group naming its first keys, any
// other error once per distinct text. The job's error is an *OpError that
// carries it.
type jobError struct {
	keys   int     // the job's keys
	failed int     // keys failed
	errs   []error // distinct by text, in plan order
	groups []keyGroup
}

// keyGroup is the keys that failed alike.
type keyGroup struct {
	err   error    // the first one's
	count int      // keys in the group
	keys  []string // the first jobErrorShown keys of a group of key faults
}

// jobErrorShown is how many groups a job's error text spells out, and how
// many keys of a group of key faults: a log line need not hold a
// thousand keys. Unwrap and KeyErr have every error.
const jobErrorShown = 3

// newJobError groups errs, the job's key errors (nil: succeeded), among
// keys keys.
func newJobError(keys int, errs []error) *jobError {
	e := &jobError{keys: keys}
	distinct := map[string]bool{}
	group := map[string]int{}
	for _, err := range errs {
		if err == nil {
			continue
		}
		e.failed++
		text := err.Error()
		if !distinct[text] {
			distinct[text] = true
			e.errs = append(e.errs, err)
		}
		by, kf := text, (*keyFault)(nil)
		if errors.As(err, &kf) && err == error(kf) {
			by = "\x00" + kf.cause.Error()
		}
		k, ok := group[by]
		if !ok {
			k = len(e.groups)
			group[by] = k
			e.groups = append(e.groups, keyGroup{err: err})
		}
		g := &e.groups[k]
		g.count++
		if kf != nil && len(g.keys) < jobErrorShown {
			g.keys = append(g.keys, kf.key)
		}
	}
	return e
}

// Error reads "2 of 4 keys failed: <error>", or with several groups
// "…: 1 key: <error>; 3 keys: <error>", the first jobErrorShown of them,
// then "; and 5 more keys (2 other errors)". A group of key faults reads
// as one: "not in the pool: "k0", "k1", "k2" and 5 more (or stored with
// another size)".
func (e *jobError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %s failed: ", e.failed, plural(e.keys, "key"))
	shown := 0
	for i, g := range e.groups[:min(len(e.groups), jobErrorShown)] {
		if i > 0 {
			b.WriteString("; ")
		}
		if len(e.groups) > 1 {
			b.WriteString(plural(g.count, "key") + ": ")
		}
		if kf, ok := g.err.(*keyFault); ok && g.count > 1 {
			kf.group(&b, g.keys, g.count)
		} else {
			b.WriteString(g.err.Error())
		}
		shown += g.count
	}
	if rest := len(e.groups) - jobErrorShown; rest > 0 {
		fmt.Fprintf(&b, "; and %s (%s)", plural(e.failed-shown, "more key"), plural(rest, "other error"))
	}
	return b.String()
}

func (e *jobError) Unwrap() []error { return e.errs }

// keyFault is a key the server answered false for: a load's miss
// (ErrNotInPool) or a store's refusal (ErrRefused).
type keyFault struct {
	cause error
	key   string
	size  uint64
}

func (f *keyFault) Error() string {
	if f.cause == ErrNotInPool {
		return fmt.Sprintf("%v: key %q (%d bytes; or stored with another size)", f.cause, f.key, f.size)
	}
	return fmt.Sprintf("%v: store of key %q (%d bytes): the pool could not take it (full, or smaller than the object)", f.cause, f.key, f.size)
}

func (f *keyFault) Unwrap() error { return f.cause }

// group writes the text of count faults of f's cause, keys the first.
func (f *keyFault) group(b *strings.Builder, keys []string, count int) {
	b.WriteString(f.cause.Error() + ": keys ")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(b, "%q", k)
	}
	if more := count - len(keys); more > 0 {
		fmt.Fprintf(b, " and %d more", more)
	}
	if f.cause == ErrNotInPool {
		b.WriteString(" (or stored with other sizes)")
	} else {
		b.WriteString(": the pool could not take them (full, or smaller than the objects)")
	}
}

// plural returns "1 key", "2 keys".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
