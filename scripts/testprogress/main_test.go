package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// What a run prints: a line per package as it finishes, a failed test's
// output (not a passing one's), and what is still running when nothing
// has finished for a while.
func TestReport(t *testing.T) {
	var out bytes.Buffer
	start := time.Now()
	r := newReport(&out, start)
	r.read(strings.NewReader(`{"Action":"start","Package":"m/a"}
{"Action":"start","Package":"m/b"}
{"Action":"run","Package":"m/a","Test":"TestOK"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"    a_test.go:9: quiet\n"}
{"Action":"pass","Package":"m/a","Test":"TestOK","Elapsed":0.1}
{"Action":"output","Package":"m/a","Output":"ok  \tm/a\t0.2s\n"}
{"Action":"pass","Package":"m/a","Elapsed":0.2}
{"Action":"output","Package":"m/b","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"m/b","Test":"TestBad","Output":"    b_test.go:7: the bytes differ\n"}
{"Action":"output","Package":"m/b","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"m/b","Test":"TestBad","Elapsed":0}
{"Action":"output","Package":"m/b","Output":"FAIL\n"}
{"Action":"output","Package":"m/b","Output":"FAIL\tm/b\t0.3s\n"}
{"Action":"fail","Package":"m/b","Elapsed":0.3}
{"Action":"output","Package":"m/c","Output":"?   \tm/c\t[no test files]\n"}
{"Action":"skip","Package":"m/c","Elapsed":0}
{"ImportPath":"m/d [m/d.test]","Action":"build-output","Output":"d_test.go:3:1: syntax error\n"}
{"ImportPath":"m/d [m/d.test]","Action":"build-fail"}
{"Action":"start","Package":"m/d"}
{"Action":"output","Package":"m/d","Output":"FAIL\tm/d [build failed]\n"}
{"Action":"fail","Package":"m/d","Elapsed":0}
{"Action":"start","Package":"m/e"}
`))
	r.last = start.Add(-time.Minute)
	r.tick(start.Add(time.Minute))
	r.summary(start.Add(2 * time.Minute))
	got := out.String()
	for _, want := range []string{
		"go test: building the packages",
		"ok   m/a ",
		"    b_test.go:7: the bytes differ\n--- FAIL: TestBad (0.00s)\n",
		"FAIL m/b ",
		"--   m/c ",
		"d_test.go:3:1: syntax error\n",
		"...  still running (1m0s in): m/e (",
		"go test: 2 packages ok, 2 failed, in 2m0s\n  FAIL m/b\n  FAIL m/d (build failed)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output does not contain %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet") || strings.Contains(got, "=== RUN") {
		t.Errorf("a passing test's output, or go test's progress lines, are shown:\n%s", got)
	}
}
