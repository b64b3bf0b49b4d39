package main

import (
	"strings"
	"testing"

	"github.com/umbp-go/umbp-go/internal/bytesize"
)

// FuzzFlagValues feeds arbitrary text to every parser of the command line
// and standard input: none panics, and a topology or group list accepted
// prints as text that parses back to the same value.
func FuzzFlagValues(f *testing.F) {
	for _, s := range []string{"tp=1/2,pp=0/2", "tp=2", "pcp=-1/1", "0:16,1:32", "[1, 2, 3]", "4MiB", "1 x", "dcp=3/4,tp=0/0", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var topo topoFlag
		if topo.Set(s) == nil {
			var again topoFlag
			if err := again.Set(topo.String()); err != nil || again.Normalized() != topo.Normalized() {
				t.Errorf("topology %q printed as %q, which parses to %v, %v", s, topo.String(), again, err)
			}
		}
		var groups groupsFlag
		if groups.Set(s) == nil {
			var again groupsFlag
			if err := again.Set(groups.String()); err != nil || again.String() != groups.String() {
				t.Errorf("groups %q printed as %q, which parses to %q, %v", s, groups.String(), again.String(), err)
			}
		}
		_, _ = readTokens(strings.NewReader(s), nil)
		if n, err := bytesize.Parse(s); err == nil && n == 0 {
			t.Errorf("bytesize.Parse(%q) = 0 without an error", s)
		}
	})
}
