// Package scripts holds the tests of the repository's scripts.
package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// script runs the named script of this directory in dir with env added,
// and returns its output and whether it succeeded.
func script(t *testing.T, name, dir string, env ...string) (string, bool) {
	t.Helper()
	path, err := filepath.Abs(name)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("%s: %v", name, err)
	}
	return string(out), err == nil
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// make fuzz fails on a crasher the fuzzer writes, naming it, and passes
// targets that find none: fuzz.sh on a module of two targets, with Go.
func TestFuzzScriptCrasher(t *testing.T) {
	if testing.Short() {
		t.Skip("fuzzes with the go command")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"go.mod": "module example.com/fz\n\ngo 1.26\n",
		"fine/fine_test.go": `package fine

import "testing"

func FuzzFine(f *testing.F) {
	f.Add([]byte("a"))
	f.Fuzz(func(t *testing.T, b []byte) {})
}
`,
		"boom/boom_test.go": `package boom

import "testing"

func FuzzBoom(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 0 {
			t.Fatal("boom")
		}
	})
}
`,
	})
	out, ok := script(t, "fuzz.sh", dir, "GO="+goTool, "FUZZTIME=2000x", "FUZZ=FuzzFine")
	if !ok || !strings.Contains(out, "fuzz: 1 targets, 2000x each: 0 crashers written, 0 other failures") {
		t.Fatalf("a target that finds nothing failed the run:\n%s", out)
	}
	out, ok = script(t, "fuzz.sh", dir, "GO="+goTool, "FUZZTIME=30s", "FUZZ=FuzzBoom")
	crashers, _ := filepath.Glob(filepath.Join(dir, "boom", "testdata", "fuzz", "FuzzBoom", "*"))
	if ok || len(crashers) != 1 {
		t.Fatalf("with a crasher written (%q), fuzz.sh succeeded %v:\n%s", crashers, ok, out)
	}
	if !strings.Contains(out, "fuzz: 1 targets, 30s each: 1 crashers written, 0 other failures") ||
		!strings.Contains(out, "crasher: "+crashers[0]) {
		t.Errorf("the summary does not name the crasher %s:\n%s", crashers[0], out)
	}
}

// fakeGo is a go command that lists one target, FuzzA of example.com/p in
// $FAKE_DIR, and fuzzes it as $FAKE_RUN says: "race" fails as Go 1.26's
// coordinator does on its own deadline, "seed" fails a seed corpus entry,
// "crash" writes a crasher and fails.
const fakeGo = `#!/usr/bin/env bash
case "$1 $2" in
"test -list") printf 'FuzzA\nok  \texample.com/p\t0.01s\n' ;;
"list -f") echo "$FAKE_DIR" ;;
"test -run")
	case "$FAKE_RUN" in
	race) printf 'fuzz: elapsed: 3s, execs: 100 (33/sec)\n--- FAIL: FuzzA (3.01s)\n    context deadline exceeded\nFAIL\nexit status 1\nFAIL\texample.com/p\t3.02s\n'; exit 1 ;;
	seed) printf -- '--- FAIL: FuzzA (0.00s)\n    --- FAIL: FuzzA/seed#0 (0.00s)\n        context deadline exceeded\n    failure while testing seed corpus entry: FuzzA/seed#0\nFAIL\n'; exit 1 ;;
	crash) mkdir -p "$FAKE_DIR/testdata/fuzz/FuzzA"; echo 'go test fuzz v1' > "$FAKE_DIR/testdata/fuzz/FuzzA/0123abcd"
		printf -- '--- FAIL: FuzzA (0.10s)\n    Failing input written to testdata/fuzz/FuzzA/0123abcd\nFAIL\n'; exit 1 ;;
	esac ;;
esac
`

// Go 1.26's coordinator race (a bare "context deadline exceeded", no input
// written) is reported and does not fail the run; a seed that fails, or a
// crasher, does.
func TestFuzzScriptCoordinatorRace(t *testing.T) {
	bin := t.TempDir()
	writeFiles(t, bin, map[string]string{"go": fakeGo})
	for _, tc := range []struct {
		run  string
		ok   bool
		want string
	}{
		{"race", true, "1 coordinator deadline races (not failures)"},
		{"seed", false, "failed:  FuzzA (example.com/p): failed without writing a crasher (exit 1"},
		{"crash", false, "1 crashers written"},
	} {
		pkgDir := t.TempDir()
		out, ok := script(t, "fuzz.sh", t.TempDir(), "GO="+filepath.Join(bin, "go"), "FAKE_DIR="+pkgDir, "FAKE_RUN="+tc.run)
		if ok != tc.ok || !strings.Contains(out, tc.want) {
			t.Errorf("%s: succeeded %v, want %v, and %q in:\n%s", tc.run, ok, tc.ok, tc.want, out)
		}
	}
}

// git runs git in dir.
func git(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// check-tree.sh passes this repository, and fails a repository that
// tracks an executable binary, a file over 1 MiB or an executable that is
// not a script, naming each, unless it is under testdata or excepted with
// a reason.
func TestCheckTree(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skipf("no git: %v", err)
	}
	if exec.Command("git", "-C", "..", "rev-parse", "--git-dir").Run() == nil {
		if out, ok := script(t, "check-tree.sh", ".."); !ok {
			t.Fatalf("this repository fails the check:\n%s", out)
		}
	}
	elf, err := os.ReadFile("/proc/self/exe") // this test's own binary
	if err != nil {
		t.Skipf("no binary to plant: %v", err)
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		mode  os.FileMode // of the planted files
		want  string      // in the failure; "" passes
	}{
		{"clean", map[string]string{"a.go": "package a\n", "b.bin": "\x00\x01\x02\x03"}, 0o644, ""},
		{"script", map[string]string{"run.sh": "#!/bin/sh\n"}, 0o755, ""},
		{"binary", map[string]string{"cmd/tool/tool": string(elf[:4096])}, 0o755, "cmd/tool/tool: an ELF executable or library"},
		{"binary without x", map[string]string{"lib.so": string(elf[:4096])}, 0o644, "lib.so: an ELF executable or library"},
		{"large", map[string]string{"data.json": strings.Repeat("x", 1<<20+1)}, 0o644, "data.json: 1048577 bytes, over 1 MiB"},
		{"executable text", map[string]string{"notes": "hello\n"}, 0o755, "notes: executable (mode 755) but not a script"},
		{"testdata", map[string]string{"x/testdata/big.bin": strings.Repeat("x", 1<<20+1) + string(elf[:64])}, 0o644, ""},
		{"excepted", map[string]string{"big.txt": strings.Repeat("x", 1<<20+1), ".ci/tree-exceptions": "# why\nbig.txt  the full vector list, read by the tests\n"}, 0o644, ""},
		{"excepted without a reason", map[string]string{"big.txt": strings.Repeat("x", 1<<20+1), ".ci/tree-exceptions": "big.txt\n"}, 0o644, "big.txt is excepted without a reason"},
		{"stale exception", map[string]string{".ci/tree-exceptions": "gone.bin  it was needed once\n"}, 0o644, "gone.bin is not tracked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			git(t, dir, "init", "-q")
			for name, text := range tc.files {
				p := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(text), tc.mode); err != nil {
					t.Fatal(err)
				}
			}
			git(t, dir, "add", ".")
			out, ok := script(t, "check-tree.sh", dir)
			if ok != (tc.want == "") || !strings.Contains(out, tc.want) {
				t.Errorf("succeeded %v with %q; want %q", ok, out, tc.want)
			}
		})
	}
}
