package docs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// pageFile is a file FIRST-PROGRAM.md gives whole: a fenced block right
// after a line <!-- file: PATH -->.
var pageFile = regexp.MustCompile("(?s)<!-- file: ([^ ]+) -->\n```[a-z]*\n(.*?)\n```")

// firstProgram writes the page's files into a new directory beside a
// stand-in for the clone (the repository itself), builds each program as a
// user would (go mod tidy, go build), runs the engine and then the
// scheduler against one server, and returns what they printed.
func firstProgram(t *testing.T, w *world) string {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	page := readDoc(t, "docs/FIRST-PROGRAM.md")
	files := pageFile.FindAllStringSubmatch(page, -1)
	if len(files) != 4 {
		t.Fatalf("FIRST-PROGRAM.md gives %d files, want 4 (two go.mod, two main.go)", len(files))
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := w.tempDir(t)
	for _, f := range files {
		text := f[2] + "\n"
		if strings.HasSuffix(f[1], "go.mod") {
			if !strings.Contains(text, "=> ../umbp-go\n") {
				t.Fatalf("%s does not replace the module with ../umbp-go", f[1])
			}
			text = strings.ReplaceAll(text, "=> ../umbp-go\n", "=> "+abs+"\n")
		}
		path := filepath.Join(dir, f[1])
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := umbptest.Start(umbptest.Options{Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var out strings.Builder
	for _, prog := range []string{"engine", "scheduler"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", prog + ".bin", "."}} {
			cmd := exec.CommandContext(ctx, goTool, args...)
			cmd.Dir = filepath.Join(dir, prog)
			if b, err := cmd.CombinedOutput(); err != nil {
				cancel()
				t.Fatalf("%s: go %s: %v\n%s", prog, strings.Join(args, " "), err, b)
			}
		}
		cmd := exec.CommandContext(ctx, filepath.Join(dir, prog, prog+".bin"), "-endpoint", srv.Endpoint())
		b, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("%s: %v\n%s", prog, err, b)
		}
		out.Write(b)
	}
	return out.String()
}
