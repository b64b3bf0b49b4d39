package tools

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// core is the library's module; every other published module requires it.
const core = "github.com/umbp-go/umbp-go"

// notTheLibrarys are modules a program that imports only the library must
// not require through it: the operator's tool's (its progress bar and
// terminal), and the development tools' (staticcheck, x/tools, the protoc
// plugins).
var notTheLibrarys = []string{
	"github.com/schollz/progressbar/v3",
	"golang.org/x/term",
	"honnef.co/go/tools",
	"golang.org/x/tools",
	"google.golang.org/grpc/cmd/protoc-gen-go-grpc",
	"github.com/umbp-go/umbp-go/tools",
}

// neverListed are those of notTheLibrarys that no module the library
// requires requires either, so that a consumer's go list -m all never
// names them. (golang.org/x/term and golang.org/x/tools are required by
// the go.mod of golang.org/x/net and golang.org/x/text, which gRPC needs:
// go list -m all names them, at those modules' versions, though no
// package of theirs is built.)
var neverListed = []string{
	"github.com/schollz/progressbar/v3",
	"honnef.co/go/tools",
	"google.golang.org/grpc/cmd/protoc-gen-go-grpc",
	"github.com/umbp-go/umbp-go/tools",
}

// A published module: its path, and its directory from the root.
type published struct{ path, dir string }

// release reads what a release tags from go.work: every module it uses
// but this one, each without a replace directive, and the one version at
// which they require each other (the library, and the tokenizer the tool
// uses), which go.work replaces with the checkout's directories.
func release(t *testing.T, root string) ([]published, string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mods []published
	var files []*modfile.File
	dirOf := map[string]string{} // module path -> directory, every module go.work uses
	for _, u := range work.Use {
		dir := path.Clean(u.Path)
		data, err := os.ReadFile(filepath.Join(root, dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.Parse(dir+"/go.mod", data, nil)
		if err != nil {
			t.Fatal(err)
		}
		dirOf[f.Module.Mod.Path] = dir
		if dir == "tools" {
			continue
		}
		mods = append(mods, published{f.Module.Mod.Path, dir})
		files = append(files, f)
	}
	versions := map[string][]string{} // version -> "module requires module" at it
	required := map[string]bool{}     // the modules of the workspace that others require
	for i, f := range files {
		for _, r := range f.Replace {
			t.Errorf("%s/go.mod replaces %s: go install and go get ignore a published module's replace directives; the workspace (go.work) is where the checkout stands in", mods[i].dir, r.Old.Path)
		}
		for _, r := range f.Require {
			if _, ours := dirOf[r.Mod.Path]; ours {
				versions[r.Mod.Version] = append(versions[r.Mod.Version], mods[i].dir+" requires "+r.Mod.Path)
				required[r.Mod.Path] = true
			}
		}
	}
	if !required[core] {
		t.Fatalf("no nested module requires %s", core)
	}
	if len(versions) != 1 {
		t.Fatalf("the modules require each other at %v: want one version, the release's", versions)
	}
	var version string
	for v := range versions {
		version = v
	}
	if !semverRelease.MatchString(version) {
		t.Fatalf("the modules require each other at %s: want a release version (vX.Y.Z), which a tag can make", version)
	}
	replaced := map[string]bool{}
	for _, r := range work.Replace {
		if !required[r.Old.Path] || r.Old.Version != version || path.Clean(r.New.Path) != dirOf[r.Old.Path] {
			t.Errorf("go.work replaces %s %s with %s: it should replace only the modules the others require, at %s, each with its own directory", r.Old.Path, r.Old.Version, r.New.Path, version)
		}
		replaced[r.Old.Path] = true
	}
	for p := range required {
		if !replaced[p] {
			t.Errorf("go.work should replace %s %s with its directory, %s", p, version, dirOf[p])
		}
	}
	return mods, version
}

var semverRelease = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)

// diskFile is a file of a module's zip.
type diskFile struct{ rel, abs string }

func (f diskFile) Path() string                 { return f.rel }
func (f diskFile) Lstat() (os.FileInfo, error)  { return os.Lstat(f.abs) }
func (f diskFile) Open() (io.ReadCloser, error) { return os.Open(f.abs) }

// layOut writes a file-system module proxy of mods at version into dir:
// each module's files are those git tracks or would track (ignored files
// left out), less those of the modules nested in it.
func layOut(t *testing.T, root, dir string, mods []published, version string) {
	t.Helper()
	ls := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	ls.Dir = root
	out, err := ls.Output()
	if err != nil {
		t.Skipf("not a git checkout (git ls-files: %v): the files of a release are not known", err)
	}
	var files []string
	for f := range strings.SplitSeq(string(out), "\x00") {
		if f != "" {
			if _, err := os.Lstat(filepath.Join(root, f)); err == nil { // not deleted
				files = append(files, f)
			}
		}
	}
	for _, m := range mods {
		var zf []zip.File
		for _, f := range files {
			rel := f
			if m.dir != "." {
				var ok bool
				if rel, ok = strings.CutPrefix(f, m.dir+"/"); !ok {
					continue
				}
			}
			if nestedIn(rel, m, mods) {
				continue
			}
			zf = append(zf, diskFile{rel, filepath.Join(root, f)})
		}
		esc, err := module.EscapePath(m.path)
		if err != nil {
			t.Fatal(err)
		}
		at := filepath.Join(dir, esc, "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			t.Fatal(err)
		}
		z, err := os.Create(filepath.Join(at, version+".zip"))
		if err != nil {
			t.Fatal(err)
		}
		if err := zip.Create(z, module.Version{Path: m.path, Version: version}, zf); err != nil {
			t.Fatalf("%s: %v", m.path, err)
		}
		if err := z.Close(); err != nil {
			t.Fatal(err)
		}
		gomod, err := os.ReadFile(filepath.Join(root, m.dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
		for name, data := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": info, version + ".mod": gomod} {
			if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// nestedIn reports whether rel, a file of m, is in a module nested in m
// (or in the unpublished tools module).
func nestedIn(rel string, m published, mods []published) bool {
	full := path.Join(m.dir, rel)
	for _, o := range append(slices.Clone(mods), published{dir: "tools"}) {
		if o.dir != m.dir && (m.dir == "." || strings.HasPrefix(o.dir, m.dir+"/")) && strings.HasPrefix(full, o.dir+"/") {
			return true
		}
	}
	return false
}

// readmeLines are the go install and go get lines of README.md's shell
// blocks, each as its words (a trailing comment left out).
func readmeLines(t *testing.T, root string) [][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]string
	in := false
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "```") {
			in = line == "```sh"
			continue
		}
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if in && len(f) == 3 && f[0] == "go" && (f[1] == "install" || f[1] == "get") {
			lines = append(lines, f)
		}
	}
	return lines
}

// A release installs, gets and builds from a module proxy as a user's
// module would: the README's go install and go get lines, run as they are
// in a module of the user's own, offline (the proxy is the repository at
// the release's version; every other module comes from this machine's
// module cache).
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the server, the tool and a program from a module proxy: not with -short")
	}
	goTool := os.Getenv("GO")
	if goTool == "" {
		goTool = "go"
	}
	if _, err := exec.LookPath(goTool); err != nil {
		t.Skipf("no go command: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	mods, version := release(t, root)
	if t.Failed() {
		t.FailNow()
	}
	tmp := t.TempDir()
	proxy := filepath.Join(tmp, "proxy")
	layOut(t, root, proxy, mods, version)

	cacheOut, err := exec.Command(goTool, "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	modcache := strings.TrimSpace(string(cacheOut))
	gobin := filepath.Join(tmp, "bin")
	// Later entries win: the user's environment, made offline and blind to
	// this checkout's workspace. A module cache of its own keeps the
	// release's modules out of this machine's.
	env := append(os.Environ(),
		"GOPROXY=file://"+proxy+",file://"+filepath.Join(modcache, "cache", "download")+",off",
		"GOMODCACHE="+filepath.Join(tmp, "mod"),
		"GOFLAGS=-modcacherw -trimpath",
		"GOSUMDB=off", "GONOSUMDB=", "GOPRIVATE=", "GONOPROXY=", "GOINSECURE=",
		"GOWORK=off", "GOTOOLCHAIN=local", "GOBIN="+gobin,
	)
	run := func(dir string, name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s (in %s): %v\n%s", filepath.Base(name), strings.Join(args, " "), dir, err, out)
		}
		return string(out)
	}
	newModule := func(name string) string {
		dir := filepath.Join(tmp, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		run(dir, goTool, "mod", "init", "example.com/"+name)
		return dir
	}

	// The README's lines, sorted by what they install or get.
	lines := readmeLines(t, root)
	byPath := map[string][]string{}
	for _, l := range lines {
		p, v, _ := strings.Cut(l[2], "@")
		if v != "latest" {
			t.Errorf("README: %q: want @latest", strings.Join(l, " "))
		}
		byPath[p] = l
	}
	want := []string{core + "/umbp", core + "/cmd/umbp", core + "/cmd/umbp-standalone-server"}
	for _, m := range mods {
		if strings.HasPrefix(m.dir, "contrib/") {
			want = append(want, m.path)
		}
	}
	for _, p := range want {
		if byPath[p] == nil {
			t.Errorf("README has no go install or go get line for %s", p)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// A program of the user's that imports the library, and nothing of
	// the tool's or the development tools'.
	app := newModule("app")
	run(app, goTool, byPath[core+"/umbp"][1:]...)
	if err := os.WriteFile(filepath.Join(app, "main.go"), []byte(appMain), 0o644); err != nil {
		t.Fatal(err)
	}
	run(app, goTool, "build", "-o", "app", ".")
	if got := strings.TrimSpace(run(app, goTool, "list", "-m", "-f", "{{.Version}}", core)); got != version {
		t.Errorf("the program requires %s %s, want %s", core, got, version)
	}
	all := strings.Fields(run(app, goTool, "list", "-m", "-f", "{{.Path}}", "all"))
	for _, m := range neverListed {
		if slices.Contains(all, m) {
			t.Errorf("a program that imports only the library lists %s in go list -m all", m)
		}
	}
	for edge := range strings.Lines(run(app, goTool, "mod", "graph")) {
		from, to, _ := strings.Cut(strings.TrimSpace(edge), " ")
		if strings.HasPrefix(from, core+"@") {
			to, _, _ = strings.Cut(to, "@")
			if slices.Contains(notTheLibrarys, to) {
				t.Errorf("the library's module requires %s: %s", to, edge)
			}
		}
	}
	for _, p := range strings.Fields(run(app, goTool, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".")) {
		if slices.Contains(notTheLibrarys, p) {
			t.Errorf("the program builds a package of %s", p)
		}
	}

	// The tool and the server, installed; the contrib modules, got.
	for _, p := range []string{core + "/cmd/umbp", core + "/cmd/umbp-standalone-server"} {
		run(tmp, goTool, byPath[p][1:]...)
	}
	ext := newModule("ext")
	for _, m := range mods {
		if strings.HasPrefix(m.dir, "contrib/") {
			run(ext, goTool, byPath[m.path][1:]...)
			run(ext, goTool, "list", "-deps", m.path+"/...")
		}
	}

	// The server they installed answers the program and the tool.
	sockDir, err := os.MkdirTemp("", "umbp-release")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	endpoint := "unix://" + filepath.Join(sockDir, "node0.grpc.sock")
	metricsAt := freePort(t)
	var serverLog bytes.Buffer
	server := exec.Command(filepath.Join(gobin, "umbp-standalone-server"), "-endpoint", endpoint, "-capacity", "64MiB", "-version", "2", "-metrics", metricsAt)
	server.Stderr = &serverLog
	stdout, err := server.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	// stop ends the server, once; its log may be read after it.
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = server.Process.Kill()
			_ = server.Wait()
		}
	}
	defer stop()
	// It prints its endpoint once it serves it and its metrics (a
	// generous bound: it prefaults 64 MiB first).
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n') // ends when the server does
		first <- line
	}()
	select {
	case line := <-first:
		if line != "listening on "+endpoint+"\n" {
			stop()
			t.Fatalf("the server's first line %q\n%s", line, serverLog.String())
		}
	case <-time.After(time.Minute):
		stop()
		t.Fatalf("the server did not say it listens within a minute\n%s", serverLog.String())
	}
	if out := run(app, filepath.Join(app, "app"), endpoint); !strings.Contains(out, "lookup: [false]") {
		t.Errorf("the program printed %q, want its lookup's answer", out)
	}
	if out := run(tmp, filepath.Join(gobin, "umbp"), "ping", "-endpoint", endpoint, "-metrics", metricsAt); !strings.Contains(out, "ready      true") || !strings.Contains(out, "of 64.0 MiB used") {
		t.Errorf("umbp ping -metrics printed %q, want the server ready and its pool", out)
	}
	if err := server.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := server.Wait(); err != nil {
		t.Errorf("the server, stopped with SIGTERM: %v\n%s", err, serverLog.String())
	}
}

// freePort is a loopback address whose port was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// appMain is the user's program: it attaches to the server it is given
// and looks one key up.
var appMain = fmt.Sprintf(`package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	%q
)

func main() {
	ctx := context.Background()
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: os.Args[1], StartupTimeout: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	h, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	fmt.Println("lookup:", h.Lookup(ctx, []string{"umbp:release:check"}))
}
`, core+"/umbp")
