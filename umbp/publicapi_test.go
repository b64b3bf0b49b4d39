package umbp_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// What a user copies uses the public packages only: the programs under
// examples/ and every file with a runnable Example, here and in contrib.
func TestExamplesUsePublicPackagesOnly(t *testing.T) {
	var files []string
	for _, root := range []string{"../examples", ".", "../contrib"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			files = append(files, path)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	checked := 0
	for _, path := range files {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(filepath.ToSlash(path), "../examples/") {
			full, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(full.Decls, func(d ast.Decl) bool {
				fn, ok := d.(*ast.FuncDecl)
				return ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example")
			}) {
				continue
			}
		}
		checked++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
				t.Errorf("%s imports %s: what users copy must use public packages only", path, p)
			}
		}
	}
	if checked < 5 { // examples/offload and lookup, umbp's, umbptest's, contrib/otel's
		t.Fatalf("%d example files found, want at least 5", checked)
	}
}
