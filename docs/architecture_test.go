package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// productionFiles returns the non-test Go files of the core module under
// dir (relative to the root), relative to the root: the nested modules,
// the commands, docs and scripts left out.
func productionFiles(t *testing.T, dirs ...string) []string {
	t.Helper()
	var files []string
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			if d.IsDir() {
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil && rel != "." {
					return filepath.SkipDir // another module
				}
				if d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				files = append(files, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// section returns the text of doc's section under the heading that starts
// with heading, up to the next heading of its level or above.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	text := readDoc(t, doc)
	i := strings.Index(text, "\n"+heading)
	if i < 0 {
		t.Fatalf("%s has no section %q", doc, heading)
	}
	level := strings.Count(strings.Fields(heading)[0], "#")
	rest := text[i+1:]
	end := regexp.MustCompile(`\n#{1,` + string(rune('0'+level)) + `} `).FindStringIndex(rest)
	if end == nil {
		return rest
	}
	return rest[:end[0]]
}

// ARCHITECTURE's map of umbp's files names every production file of the
// package and no file it does not have; every Go file it names anywhere
// exists; its table of packages names every package of umbp/ and
// internal/.
func TestArchitectureFileMap(t *testing.T) {
	const doc = "docs/ARCHITECTURE.md"
	inside := section(t, doc, "## Inside `umbp`")
	block := regexp.MustCompile("(?s)```\n(.*?)```").FindStringSubmatch(inside)
	if block == nil {
		t.Fatalf("%s: the section on umbp has no map of its files", doc)
	}
	goFile := regexp.MustCompile(`\b[a-z0-9_]+\.go\b`)
	mapped := goFile.FindAllString(block[1], -1)
	var have []string
	for _, f := range productionFiles(t, "umbp") {
		if filepath.Dir(f) == "umbp" {
			have = append(have, filepath.Base(f))
		}
	}
	for _, f := range have {
		if f != "doc.go" && !slices.Contains(mapped, f) {
			t.Errorf("%s: umbp/%s is not in the map of umbp's files", doc, f)
		}
	}
	for _, f := range mapped {
		if !slices.Contains(have, f) {
			t.Errorf("%s: the map of umbp's files names %s, which umbp does not have", doc, f)
		}
	}

	// Every file named anywhere is one of the repository's.
	var base []string
	for _, f := range productionFiles(t, ".") {
		base = append(base, filepath.Base(f))
	}
	for _, f := range goFile.FindAllString(readDoc(t, doc), -1) {
		if !slices.Contains(base, f) {
			t.Errorf("%s names %s: no production file of the module has that name", doc, f)
		}
	}

	// Every package is in the table.
	table := section(t, doc, "## Packages")
	pkgs := map[string]bool{}
	for _, f := range productionFiles(t, "umbp", "internal") {
		pkgs[filepath.Dir(f)] = true
	}
	for p := range pkgs {
		if !strings.Contains(table, "`"+p+"`") && !strings.Contains(table, "`"+filepath.Base(p)+"`") {
			t.Errorf("%s: package %s is not in the table of packages", doc, p)
		}
	}
}

// timingFiles returns the production files that declare a duration at
// package level: a constant or variable of type time.Duration, or one
// whose value is made of time's units.
func timingFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, f := range productionFiles(t, "umbp", "internal") {
		file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, f), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, decl := range file.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST && g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				if isTime(vs.Type, "Duration") {
					found = true
				}
				for _, v := range vs.Values {
					ast.Inspect(v, func(n ast.Node) bool {
						if _, ok := n.(*ast.FuncLit); ok {
							return false
						}
						for _, unit := range []string{"Nanosecond", "Microsecond", "Millisecond", "Second", "Minute", "Hour"} {
							if e, ok := n.(ast.Expr); ok && isTime(e, unit) {
								found = true
							}
						}
						return true
					})
				}
			}
		}
		if found {
			files = append(files, f)
		}
	}
	return files
}

// isTime reports whether e is time.name.
func isTime(e ast.Expr, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "time"
}

// ARCHITECTURE says where every timing lives: each production file that
// declares a duration is named in its section on timings (by its path, or
// by its package's directory where the section says "the server's own are
// in" it).
func TestArchitectureTimings(t *testing.T) {
	const doc = "docs/ARCHITECTURE.md"
	text := section(t, doc, "## Timings, retries and sizes")
	files := timingFiles(t)
	if len(files) == 0 {
		t.Fatal("no production file declares a duration: the scan is broken")
	}
	for _, f := range files {
		if !strings.Contains(text, "`"+f+"`") && !strings.Contains(text, "`"+filepath.Dir(f)+"`") {
			t.Errorf("%s declares a timing, and %s's section on timings does not name it (or its package)", f, doc)
		}
	}
}
