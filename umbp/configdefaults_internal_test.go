package umbp

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/umbp-go/umbp-go/internal/rpc"
)

// A configDefault is what a zero field of a config becomes, and what the
// field's doc comment says of it.
type configDefault struct {
	field string
	doc   string
	want  any
}

// Every default of Config and ClusterConfig is the one its doc comment
// says; no field gets a default its doc does not pin here; and a field
// both configs have means the same in both, its zero value included.
func TestConfigDefaults(t *testing.T) {
	zeroMeans := func(name string) string { return "Zero means " + name + "." }
	quarantine := "Zero means DefaultLoadFailureQuarantine; negative turns quarantine off"
	defaults := map[string][]configDefault{
		"Config": {
			{"NumWorkers", zeroMeans("DefaultNumWorkers"), DefaultNumWorkers},
			{"Timeout", zeroMeans("DefaultTimeout"), DefaultTimeout},
			{"LookupTimeout", zeroMeans("DefaultLookupTimeout"), DefaultLookupTimeout},
			{"StartupTimeout", zeroMeans("DefaultStartupTimeout"), DefaultStartupTimeout},
			{"LoadFailureQuarantine", quarantine, DefaultLoadFailureQuarantine},
			{"Logger", "Nil means slog.Default().", slog.Default()},
		},
		"ClusterConfig": {
			{"HedgeDelay", "Zero means DefaultHedgeDelay; negative asks one replica at a time.", DefaultHedgeDelay},
			{"Timeout", zeroMeans("DefaultTimeout"), DefaultTimeout},
			{"LookupTimeout", zeroMeans("DefaultLookupTimeout"), DefaultLookupTimeout},
			{"StartupTimeout", zeroMeans("DefaultStartupTimeout"), DefaultStartupTimeout},
			{"LoadFailureQuarantine", quarantine, DefaultLoadFailureQuarantine},
			{"MaxReplyBytes", fmt.Sprintf("(0: the protocol's message limit, %d MiB)", rpc.MaxMessageSize>>20), rpc.MaxMessageSize},
			{"MaxNodes", fmt.Sprintf("(0: %d)", rpc.MaxNodes), rpc.MaxNodes},
			{"Logger", "Nil means slog.Default().", slog.Default()},
		},
	}
	s, err := Config{Endpoint: "/run/umbp/node0.grpc.sock"}.settle()
	if err != nil {
		t.Fatal(err)
	}
	c, err := ClusterConfig{Masters: []string{"127.0.0.1:15558"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	settled := map[string]reflect.Value{"Config": reflect.ValueOf(s.Config), "ClusterConfig": reflect.ValueOf(c)}
	docs := fieldDocs(t, "config.go")
	for typ, defs := range defaults {
		v := settled[typ]
		pinned := map[string]bool{}
		for _, d := range defs {
			pinned[d.field] = true
			if got := v.FieldByName(d.field).Interface(); got != d.want {
				t.Errorf("%s.%s: zero becomes %v, want %v", typ, d.field, got, d.want)
			}
			if doc := docs[typ+"."+d.field]; !strings.Contains(doc, d.doc) {
				t.Errorf("%s.%s's doc does not say %q:\n\t%s", typ, d.field, d.doc, doc)
			}
		}
		// A field the settling changed from zero has a pinned default.
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() || pinned[f.Name] || f.Name == "Endpoint" || f.Name == "Masters" {
				continue
			}
			if !v.Field(i).IsZero() {
				t.Errorf("%s.%s: zero becomes %v, a default no doc is pinned for", typ, f.Name, v.Field(i).Interface())
			}
		}
	}
	// One meaning: a field of both configs settles alike.
	cv, kv := settled["Config"], settled["ClusterConfig"]
	for i := range cv.NumField() {
		name := cv.Type().Field(i).Name
		if _, ok := kv.Type().FieldByName(name); !ok || !cv.Type().Field(i).IsExported() {
			continue
		}
		if a, b := cv.Field(i), kv.FieldByName(name); a.Kind() != reflect.Func && a.Kind() != reflect.Interface && !reflect.DeepEqual(a.Interface(), b.Interface()) {
			t.Errorf("%s: zero means %v in Config and %v in ClusterConfig", name, a.Interface(), b.Interface())
		}
	}
}

// fieldDocs returns the doc comment of each field of the struct types of
// file, as TYPE.FIELD; a field without one (declared below another, under
// its comment) has the one above it.
func fieldDocs(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return false
		}
		last := ""
		for _, fl := range st.Fields.List {
			if fl.Doc != nil {
				last = strings.Join(strings.Fields(fl.Doc.Text()), " ")
			}
			for _, name := range fl.Names {
				docs[ts.Name.Name+"."+name.Name] = last
			}
		}
		return false
	})
	return docs
}

// A master address whose port is no TCP port, and negative or non-finite
// tier weights, are refused before anything is dialled, naming the field.
func TestConfigRefusesBadPortAndWeights(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:http", "[::1]:-1"} {
		_, err := NewClusterRuntime(ClusterConfig{Masters: []string{addr}})
		if !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("master %s: %v, want ErrInvalidConfig", addr, err)
		}
		if want := "ClusterConfig.Masters \"" + addr + "\": port "; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "is not a TCP port (1 to 65535)") {
			t.Errorf("master %s: %v; want it to name the field and say the port is none", addr, err)
		}
	}
	_, err := NewClusterRuntime(ClusterConfig{Masters: []string{"127.0.0.1:99999"}})
	if want := `umbp: invalid configuration: ClusterConfig.Masters "127.0.0.1:99999": port "99999" is not a TCP port (1 to 65535)`; err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	for _, w := range []TierWeights{{HBM: -1}, {DRAM: -0.5, HBM: 1}, {SSD: math.NaN()}, {HBM: math.Inf(1)}} {
		err := ScoreRequest{BlockHashes: []string{"h"}, Weights: w}.Validate()
		if !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), "score: the weight Weights.") || !strings.Contains(err.Error(), ": want 0 or more") {
			t.Errorf("weights %+v: %v; want ErrInvalidKey naming the field", w, err)
		}
	}
	err = ScoreRequest{BlockHashes: []string{"h"}, Weights: TierWeights{HBM: 1, DRAM: -0.5}}.Validate()
	if want := "umbp: invalid key: score: the weight Weights.DRAM is -0.5: want 0 or more"; err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	if err := (ScoreRequest{BlockHashes: []string{"h"}, Weights: TierWeights{HBM: 1, DRAM: 0.8, SSD: 0}}).Validate(); err != nil {
		t.Errorf("weights of 0 or more: %v", err)
	}
}
