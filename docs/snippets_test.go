package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// snippetPackages are the packages the documents' Go snippets use, by the
// name they are used under, and their directories from the root.
var snippetPackages = map[string]string{
	"umbp":           "umbp",
	"umbptest":       "umbp/umbptest",
	"vllmhash":       "umbp/vllmhash",
	"umbpprometheus": "contrib/prometheus",
	"umbpotel":       "contrib/otel",
}

// api is what a package exports, read from its source: its package-level
// names, the fields of its struct types, the methods of its types, and the
// type each function and method returns first.
type api struct {
	names   map[string]bool
	fields  map[string]map[string]bool // type → field
	methods map[string]map[string]bool // type → method
	returns map[string]string          // "Func" or "Type.Method" → "pkg.Type"
}

// readAPI parses the non-test Go files in dir, the package used as pkg.
func readAPI(t *testing.T, pkg, dir string) *api {
	t.Helper()
	a := &api{names: map[string]bool{}, fields: map[string]map[string]bool{}, methods: map[string]map[string]bool{}, returns: map[string]string{}}
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	typeName := func(e ast.Expr) string {
		if s, ok := e.(*ast.StarExpr); ok {
			e = s.X
		}
		if ix, ok := e.(*ast.IndexExpr); ok { // a generic type's receiver
			e = ix.X
		}
		switch x := e.(type) {
		case *ast.Ident:
			return pkg + "." + x.Name
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok {
				return id.Name + "." + x.Sel.Name
			}
		}
		return ""
	}
	add := func(m map[string]map[string]bool, typ, name string) {
		if m[typ] == nil {
			m[typ] = map[string]bool{}
		}
		m[typ][name] = true
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				first := ""
				if r := d.Type.Results; r != nil && len(r.List) > 0 {
					first = typeName(r.List[0].Type)
				}
				if d.Recv == nil {
					a.names[d.Name.Name] = true
					a.returns[d.Name.Name] = first
					continue
				}
				recv := strings.TrimPrefix(typeName(d.Recv.List[0].Type), pkg+".")
				add(a.methods, recv, d.Name.Name)
				a.returns[recv+"."+d.Name.Name] = first
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							a.names[n.Name] = true
						}
					case *ast.TypeSpec:
						a.names[s.Name.Name] = true
						st, ok := s.Type.(*ast.StructType)
						if !ok {
							continue
						}
						for _, fl := range st.Fields.List {
							for _, n := range fl.Names {
								add(a.fields, s.Name.Name, n.Name)
							}
							if len(fl.Names) == 0 { // embedded
								if n := typeName(fl.Type); n != "" {
									add(a.fields, s.Name.Name, n[strings.LastIndexByte(n, '.')+1:])
								}
							}
						}
					}
				}
			}
		}
	}
	return a
}

// goBlock matches a document's Go snippets.
var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// Every name a Go snippet of the README and docs/ takes from this module's
// packages exists: the package's functions, types and values, the fields
// of the struct literals it writes, and the methods and fields it uses on a
// variable whose type the snippet shows (x := pkg.F(…), x, err := y.M(…),
// x := pkg.T{…}). A snippet is a fragment, not a program: what it does not
// show is not checked.
func TestSnippetsNameTheAPI(t *testing.T) {
	apis := map[string]*api{}
	for pkg, dir := range snippetPackages {
		apis[pkg] = readAPI(t, pkg, dir)
	}
	checked := 0
	for _, doc := range documents(t) {
		text := readDoc(t, doc)
		for _, m := range goBlock.FindAllStringSubmatchIndex(text, -1) {
			line := strings.Count(text[:m[2]], "\n") + 1
			for _, p := range checkSnippet(apis, text[m[2]:m[3]]) {
				t.Errorf("%s:%d: %s", doc, line+p.line-1, p.msg)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no Go snippet found")
	}
}

type snippetProblem struct {
	line int
	msg  string
}

type tok struct {
	tok  token.Token
	lit  string
	line int
}

// checkSnippet returns what snippet names that apis do not have.
func checkSnippet(apis map[string]*api, snippet string) []snippetProblem {
	var toks []tok
	fset := token.NewFileSet()
	f := fset.AddFile("snippet", -1, len(snippet))
	var s scanner.Scanner
	s.Init(f, []byte(snippet), nil, scanner.ScanComments)
	for {
		pos, tk, lit := s.Scan()
		if tk == token.EOF {
			break
		}
		if tk == token.COMMENT {
			continue
		}
		toks = append(toks, tok{tk, lit, fset.Position(pos).Line})
	}
	var probs []snippetProblem
	bad := func(i int, format string, args ...any) {
		probs = append(probs, snippetProblem{toks[i].line, fmt.Sprintf(format, args...)})
	}
	vars := map[string]string{} // variable → "pkg.Type"
	ident := func(i int) string {
		if i >= 0 && i < len(toks) && toks[i].tok == token.IDENT {
			return toks[i].lit
		}
		return ""
	}
	is := func(i int, tk token.Token) bool { return i >= 0 && i < len(toks) && toks[i].tok == tk }
	// has reports whether typ ("pkg.Type") has name as a field or method.
	has := func(typ, name string) (known, ok bool) {
		pkg, tn, _ := strings.Cut(typ, ".")
		a := apis[pkg]
		if a == nil || !a.names[tn] {
			return false, false
		}
		return true, a.fields[tn][name] || a.methods[tn][name]
	}
	// literal checks the keyed fields of the composite literal of typ
	// whose opening brace is toks[open], elements one level down when
	// elems.
	literal := func(open int, typ string, elems bool) {
		want := 1
		if elems {
			want = 2
		}
		depth := 0
		for i := open; i < len(toks); i++ {
			switch toks[i].tok {
			case token.LBRACE:
				depth++
			case token.RBRACE:
				depth--
				if depth == 0 {
					return
				}
			case token.COLON:
				if depth == want && ident(i-1) != "" && (is(i-2, token.LBRACE) || is(i-2, token.COMMA)) {
					if known, ok := has(typ, toks[i-1].lit); known && !ok {
						bad(i-1, "%s has no field %s", typ, toks[i-1].lit)
					}
				}
			}
		}
	}
	for i := 0; i < len(toks); i++ {
		name := ident(i)
		if name == "" || !is(i+1, token.PERIOD) || ident(i+2) == "" {
			continue
		}
		sel := toks[i+2].lit
		if a := apis[name]; a != nil && vars[name] == "" {
			if !a.names[sel] {
				bad(i+2, "package %s has no %s", name, sel)
				continue
			}
			typ := name + "." + sel
			switch {
			case is(i+3, token.LBRACE): // pkg.T{…}
				elems := is(i-1, token.RBRACK) && is(i-2, token.LBRACK)
				if !elems {
					assign(toks, i, typ, vars)
				}
				literal(i+3, typ, elems)
			case is(i+3, token.LPAREN): // pkg.F(…)
				if r := a.returns[sel]; r != "" {
					assign(toks, i, r, vars)
				}
			}
			continue
		}
		typ := vars[name]
		if typ == "" {
			continue
		}
		known, ok := has(typ, sel)
		if known && !ok {
			bad(i+2, "%s (%s) has no field or method %s", name, typ, sel)
			continue
		}
		pkg, tn, _ := strings.Cut(typ, ".")
		if r := apis[pkg].returns[tn+"."+sel]; r != "" && is(i+3, token.LPAREN) {
			assign(toks, i, r, vars)
		}
	}
	return probs
}

// assign records typ as the type of the variable the expression at toks[i]
// is assigned to first: "x := …" or "x, err := …" (or "=").
func assign(toks []tok, i int, typ string, vars map[string]string) {
	j := i - 1
	if j < 0 || (toks[j].tok != token.DEFINE && toks[j].tok != token.ASSIGN) {
		return
	}
	// Back over "a, b" to the first name.
	k := j - 1
	for k-2 >= 0 && toks[k-1].tok == token.COMMA && toks[k-2].tok == token.IDENT {
		k -= 2
	}
	if k >= 0 && toks[k].tok == token.IDENT && (k == 0 || toks[k-1].tok == token.SEMICOLON || toks[k-1].tok == token.LBRACE || toks[k-1].tok == token.RBRACE) {
		vars[toks[k].lit] = typ
	}
}

// The check sees each kind of drift it claims to see.
func TestCheckSnippetCatches(t *testing.T) {
	apis := map[string]*api{}
	for pkg, dir := range snippetPackages {
		apis[pkg] = readAPI(t, pkg, dir)
	}
	for _, c := range []struct{ snippet, want string }{
		{"rt, err := umbp.NewStandaloneRuntimes(cfg)", "package umbp has no NewStandaloneRuntimes"},
		{"cfg := umbp.Config{Endpoint: e, LookupTimeouts: d}", "umbp.Config has no field LookupTimeouts"},
		{"rt, err := umbp.NewStandaloneRuntime(cfg)\nsched, err := rt.NewSchedulerHandle(ctx)\nhits := sched.Lookups(ctx, keys)", "sched (umbp.SchedulerHandle) has no field or method Lookups"},
		{"rt, err := umbp.NewClusterRuntime(cfg)\nw, err := rt.NewWorkerHandle(ctx, nil)", "rt (umbp.ClusterRuntime) has no field or method NewWorkerHandle"},
		{"job := w.StoreBlocks([]umbp.Block{\n\t{Key: k, BlockIDs: 7},\n})", "umbp.Block has no field BlockIDs"},
		{"l := &umbp.KVLayoutDescriptor{Regions: []umbp.KVRegion{{LayerName: n, Strides: 1}}}", "umbp.KVRegion has no field Strides"},
		{"r := umbptest.NewReplicatedMaster(t, 3, umbptest.MasterOptions{})\naddr := r.Replicas(0).Addr()", "r (umbptest.ReplicatedMaster) has no field or method Replicas"},
	} {
		probs := checkSnippet(apis, c.snippet)
		if len(probs) != 1 || probs[0].msg != c.want {
			t.Errorf("%q: %v, want %q", c.snippet, probs, c.want)
		}
	}
	ok := "rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: e})\nsched, err := rt.NewSchedulerHandle(ctx)\nn := sched.LookupPrefix(ctx, keys)\nw, err := rt.NewWorkerHandle(ctx, layout)\njob := w.StoreBlocks([]umbp.Block{{Key: k, BlockID: 7}})\nerr = w.Wait(ctx, job)"
	if probs := checkSnippet(apis, ok); len(probs) != 0 {
		t.Errorf("a correct snippet: %v", probs)
	}
}
