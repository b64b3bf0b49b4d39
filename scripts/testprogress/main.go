// Command testprogress runs go test with the arguments it is given and
// says what the run is doing while it does it: a line per package as it
// finishes (ok, FAIL, no tests), the output of the tests that failed, and
// every 30 seconds without a finished package, what is still building or
// running. It exits with go test's status. make test runs it:
//
//	go run ./scripts/testprogress [-C dir] [go test flags] [packages]
//
// -C runs go test in dir (another module of the repository); $GO, when
// set, is the go command.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"
)

func main() {
	args := os.Args[1:]
	var dir string
	if len(args) >= 2 && args[0] == "-C" {
		dir, args = args[1], args[2:]
	}
	goTool := os.Getenv("GO") // as make passes it
	if goTool == "" {
		goTool = "go"
	}
	cmd := exec.Command(goTool, append([]string{"test", "-json"}, args...)...)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		os.Exit(2)
	}
	r := newReport(os.Stdout, time.Now())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				r.tick(now)
			}
		}
	})
	r.read(out)
	err = cmd.Wait()
	close(stop)
	wg.Wait()
	r.summary(time.Now())
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			os.Exit(ee.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		os.Exit(2)
	}
}

// event is one line of go test -json (cmd/test2json), build events
// included.
type event struct {
	Time       time.Time
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Elapsed    float64
	Output     string
}

// report turns go test's events into the lines a person reads.
type report struct {
	mu       sync.Mutex
	w        io.Writer
	start    time.Time
	last     time.Time            // when a package last finished
	running  map[string]time.Time // packages started and not finished
	output   map[string][]string  // per package and test, output so far
	ok, fail int
	failed   []string
	// buildFailed are the packages whose test binary did not build.
	buildFailed map[string]bool
}

func newReport(w io.Writer, now time.Time) *report {
	fmt.Fprintf(w, "go test: building the packages and their tests; each is listed as it finishes\n")
	return &report{w: w, start: now, last: now, running: map[string]time.Time{}, output: map[string][]string{}, buildFailed: map[string]bool{}}
}

func (r *report) read(in io.Reader) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(r.w, sc.Text()) // not an event: go test's own words
			continue
		}
		r.event(e)
	}
}

func (r *report) event(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.w, e.Output)
	case "build-fail":
		// Its package's fail follows: counted there.
		r.buildFailed[strings.Fields(e.ImportPath)[0]] = true
	case "start":
		r.running[e.Package] = time.Now()
	case "output":
		r.output[key] = append(r.output[key], e.Output)
	case "pass", "skip":
		if e.Test != "" {
			delete(r.output, key)
			return
		}
		r.done(e, "ok  ")
	case "fail":
		if e.Test != "" {
			// A failed test's output, as go test prints it without -json.
			for _, l := range r.output[key] {
				if !strings.HasPrefix(l, "=== ") {
					fmt.Fprint(r.w, l)
				}
			}
			delete(r.output, key)
			return
		}
		r.done(e, "FAIL")
	}
}

// done reports a package that finished.
func (r *report) done(e event, word string) {
	pkgKey := e.Package + "\x00"
	lines := r.output[pkgKey]
	delete(r.output, pkgKey)
	delete(r.running, e.Package)
	r.last = time.Now()
	if word == "FAIL" {
		// The package's own output: a panic, a leak report, a timeout.
		for _, l := range lines {
			if !strings.HasPrefix(l, "=== ") && !strings.HasPrefix(l, "ok ") && !strings.HasPrefix(l, "FAIL\t") {
				fmt.Fprint(r.w, l)
			}
		}
		r.fail++
		if r.buildFailed[e.Package] {
			r.failed = append(r.failed, e.Package+" (build failed)")
		} else {
			r.failed = append(r.failed, e.Package)
		}
	} else {
		r.ok++
		if slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "[no test files]") }) {
			word = "--  "
		}
	}
	fmt.Fprintf(r.w, "%s %-60s %6.1fs  (%s in)\n", word, e.Package, e.Elapsed, since(r.start, r.last))
}

// tick says what is still going on when no package has finished for a
// while.
func (r *report) tick(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.last) < 25*time.Second {
		return
	}
	if len(r.running) == 0 {
		fmt.Fprintf(r.w, "...  still building (%s in)\n", since(r.start, now))
		return
	}
	var pkgs []string
	for p, t := range r.running {
		pkgs = append(pkgs, fmt.Sprintf("%s (%s)", p, since(t, now)))
	}
	slices.Sort(pkgs)
	fmt.Fprintf(r.w, "...  still running (%s in): %s\n", since(r.start, now), strings.Join(pkgs, ", "))
}

func (r *report) summary(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.w, "go test: %d packages ok, %d failed, in %s\n", r.ok, r.fail, since(r.start, now))
	for _, p := range r.failed {
		fmt.Fprintf(r.w, "  FAIL %s\n", p)
	}
}

func since(t, now time.Time) string { return now.Sub(t).Round(time.Second).String() }
