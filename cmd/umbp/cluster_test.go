package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// clusterMaster is a test master with node n1 holding keys k1, k2 in the
// pool and hashes h0, h1 (HBM, DRAM) in the external KV index, and n2
// holding h0 on SSD.
func clusterMaster(t *testing.T) *umbptest.Master {
	t.Helper()
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	cc, err := grpc.NewClient("passthrough:///"+m.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := umbppb.NewUMBPMasterClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range []string{"n1", "n2"} {
		if _, err := c.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: id, PeerAddress: id + ":9"}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	steps := []func() error{
		func() error {
			_, err := c.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n1", IsFullSync: true, Bundles: []*umbppb.EventBundle{{Events: []*umbppb.KvEvent{
				{Key: "k1", Tier: umbppb.TierType_TIER_DRAM, Size: 1}, {Key: "k2", Tier: umbppb.TierType_TIER_DRAM, Size: 1},
			}}}})
			return err
		},
		func() error {
			_, err := c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n1", Hashes: []string{"h0"}, Tier: umbppb.TierType_TIER_HBM})
			return err
		},
		func() error {
			_, err := c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n1", Hashes: []string{"h1"}, Tier: umbppb.TierType_TIER_DRAM})
			return err
		},
		func() error {
			_, err := c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n2", Hashes: []string{"h0"}, Tier: umbppb.TierType_TIER_SSD})
			return err
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func TestClusterCommand(t *testing.T) {
	m := clusterMaster(t)
	// The same forms as lookup's, and the same rule for keys: -raw for
	// keys that are not of umbp key make's form.
	out, _ := mustRun(t, 0, "", "cluster", "lookup", "-raw", "-master", m.Addr(), "k1", "x", "k2")
	mustContain(t, "cluster lookup", out, "hit  k1\n", "miss x\n", "hit  k2\n", "2 of 3 keys held, the leading 1 (answered in ")
	out, _ = mustRun(t, 0, "k1\nx\n", "cluster", "-master", m.Addr(), "lookup", "-raw", "-q")
	if strings.Contains(out, "hit") || !strings.HasPrefix(out, "1 of 2 keys held, the leading 1 ") {
		t.Errorf("cluster lookup -q from stdin, -master before the subcommand:\n%s", out)
	}
	out, _ = mustRun(t, 0, "", "cluster", "lookup", "-raw", "-json", "-master", m.Addr(), "k1", "x")
	var keys keysAnswer
	if err := json.Unmarshal([]byte(out), &keys); err != nil {
		t.Fatal(err)
	}
	if want := []keyAnswer{{"k1", true}, {"x", false}}; !slices.Equal(keys.Keys, want) || keys.Held != 1 || keys.Leading != 1 {
		t.Errorf("cluster lookup -json: %+v", keys)
	}

	out, _ = mustRun(t, 0, "", "cluster", "match", "-master", m.Addr(), "-json", "h0", "h1")
	var ans scoreAnswer
	if err := json.Unmarshal([]byte(out), &ans); err != nil {
		t.Fatal(err)
	}
	if len(ans.Nodes) != 2 || ans.Nodes[0].Node != "n1" || ans.Nodes[0].Prefix != 2 || ans.Nodes[0].HBM != 1 || ans.Nodes[0].DRAM != 1 ||
		ans.Nodes[1].Node != "n2" || ans.Nodes[1].SSD != 1 || ans.Best != "n1" {
		t.Errorf("cluster match = %+v", ans)
	}

	out, _ = mustRun(t, 0, "", "cluster", "score", "-master", m.Addr(), "-nodes", "n2,ghost", "-w-ssd", "3", "h0", "h1")
	mustContain(t, "cluster score", out, "best n2")

	_, errOut := mustRun(t, 2, "", "cluster", "score", "-master", m.Addr(), "h0")
	mustContain(t, "score without -nodes", errOut, "-nodes is required")
	t.Setenv("UMBP_MASTER_ADDRESS", "")
	_, errOut = mustRun(t, 2, "", "cluster", "lookup", "-raw", "k")
	mustContain(t, "no master", errOut, "-master (or $UMBP_MASTER_ADDRESS) is required")
	if m.Calls("RouteGet")+m.Calls("BatchRouteGet") != 0 {
		t.Error("the command called RouteGet")
	}
}

// Usage errors are found before anything is dialled, exit 2 and name the
// flag that fixes them: the master is never asked.
func TestClusterUsageErrors(t *testing.T) {
	m := clusterMaster(t)
	before := m.Calls("BatchLookup") + m.Calls("MatchExternalKv")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"lookup", "-master", m.Addr(), "badkey"}, []string{"invalid key", "pass -raw"}},
		{[]string{"lookup", "-master", "127.0.0.1:1", "badkey"}, []string{"invalid key"}},
		{[]string{"lookup", "-master", m.Addr(), "-raw", "a\xffb"}, []string{"not valid UTF-8"}},
		{[]string{"lookup", "-master", m.Addr()}, []string{"name the keys"}},
		{[]string{"lookup", "-master", "192.0.2.1:5", "-raw", "k"}, []string{"-master 192.0.2.1:5 is not on loopback", "-tls-ca", "-allow-plaintext"}},
		{[]string{"lookup", "-master", "unix:///run/umbp/standalone/node0.grpc.sock", "-raw", "k"}, []string{"is not host:port", "umbp lookup -endpoint unix:///run/umbp/standalone/node0.grpc.sock"}},
		{[]string{"lookup", "-master", "no-port", "-raw", "k"}, []string{"-master no-port: not host:port"}},
		{[]string{"lookup", "-master", m.Addr(), "-timeout", "0", "-raw", "k"}, []string{"-timeout must be positive"}},
		{[]string{"lookup", "-master", m.Addr(), "-tls-cert", "c.pem", "-raw", "k"}, []string{"-tls-cert and -tls-key need -tls-ca"}},
		{[]string{"lookup", "-master", m.Addr(), "-ns", "llama", "-raw", "k"}, []string{"-ns does not apply to cluster lookup of keys"}},
		{[]string{"lookup", "-master", m.Addr(), "-tokens", "-q", "-ns", "m", "-seed", "0", "1"}, []string{"-q does not apply to cluster lookup -tokens"}},
		{[]string{"lookup", "-master", m.Addr(), "-tokens", "-ns", "m", "-seed", "0", "-topo", "tp=1/2", "1"}, []string{"-topo tp=1/2 names a rank", "tp=2"}},
		{[]string{"lookup", "-master", m.Addr(), "-tokens", "-ns", "m", "1"}, []string{"-seed is required"}},
		{[]string{"lookup", "-master", m.Addr(), "-w-hbm", "2", "-raw", "k"}, []string{"flag provided but not defined: -w-hbm"}},
		{[]string{"match", "-master", m.Addr(), "-q", "h0"}, []string{"flag provided but not defined: -q"}},
		{[]string{"match", "-master", m.Addr(), "-w-dram", "-1", "h0"}, []string{"-w-dram -1: want a weight of 0 or more"}},
		{[]string{"match", "-master", m.Addr(), "-seed", "0", "h0"}, []string{"-seed does not apply to cluster match of hashes"}},
		{[]string{"score", "-master", m.Addr(), "-nodes", "n1,n1", "h0"}, []string{"listed twice"}},
		{[]string{"score", "-master", m.Addr(), "-nodes", "n1", "-topo", "tp=x", "h0"}, []string{`invalid value "tp=x" for flag -topo`}},
		{[]string{"frob"}, []string{`unknown subcommand "frob"`}},
		{nil, []string{"name a subcommand"}},
	} {
		args := append([]string{"cluster"}, tc.args...)
		start := time.Now()
		stdout, stderr := mustRun(t, exitUsage, "", args...)
		if took := time.Since(start); took > time.Second {
			t.Errorf("umbp %s: answered in %v", strings.Join(args, " "), took)
		}
		mustContain(t, strings.Join(args, " "), stderr, tc.want...)
		help := "umbp help cluster" // with the subcommand the error is of
		if len(tc.args) > 0 && tc.args[0] != "frob" {
			help += " " + tc.args[0]
		}
		mustContain(t, strings.Join(args, " "), stderr, "umbp "+strings.TrimPrefix(help, "umbp help ")+": ", "run '"+help+"' for its flags\n")
		if stdout != "" || strings.Count(stderr, "\n") > 3 || strings.Contains(stderr, "ClusterConfig") {
			t.Errorf("umbp %s: stdout %q, stderr %q: want the error and a pointer to help", strings.Join(args, " "), stdout, stderr)
		}
	}
	if after := m.Calls("BatchLookup") + m.Calls("MatchExternalKv"); after != before {
		t.Errorf("%d calls reached the master", after-before)
	}
}

// A master that refuses connections is said at once, in words, as a
// missing server socket is: exit 1 well within a second.
func TestClusterRefusedMaster(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	addrs := []string{closed}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:1", time.Second); err == nil {
		_ = c.Close() // something listens on port 1 here
	} else {
		addrs = append(addrs, "127.0.0.1:1")
	}
	for _, addr := range addrs {
		for _, args := range [][]string{
			{"cluster", "lookup", "-master", addr, testKey("0a")},
			{"cluster", "lookup", "-master", addr, "-tokens", "-ns", "m", "-seed", "0", "1", "2"},
			{"cluster", "match", "-master", addr, "h0"},
			{"cluster", "score", "-master", addr, "-nodes", "n1", "h0"},
		} {
			start := time.Now()
			_, stderr := mustRun(t, exitFail, "", args...)
			took := time.Since(start)
			if took > time.Second {
				t.Errorf("umbp %s: answered in %v, want under a second", strings.Join(args, " "), took)
			}
			want := "umbp cluster " + args[1] + ": no master listens on " + addr + " (connection refused): start it, or name it with -master"
			if !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("umbp %s:\n%s\nwant the one line %q", strings.Join(args, " "), stderr, want)
			}
			t.Logf("umbp %s: exit 1 in %v", strings.Join(args, " "), took)
		}
	}
}

// A master that accepts connections but never answers (a stopped
// process: the kernel still completes the handshake) fails the command
// at -timeout with the hint, not gRPC's words.
func TestClusterStoppedMaster(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // never accepted: as a SIGSTOPped master
	_, stderr := mustRun(t, exitFail, "", "cluster", "lookup", "-master", ln.Addr().String(), "-timeout", "200ms", testKey("0a"))
	want := "umbp cluster lookup: the master at " + ln.Addr().String() + " accepts connections but did not answer within 200ms (-timeout): a stopped process"
	if !strings.HasPrefix(stderr, want) || strings.Contains(stderr, "rpc error") {
		t.Errorf("stopped master:\n%s\nwant %q", stderr, want)
	}
}

func TestClusterCommandStalledMaster(t *testing.T) {
	m := clusterMaster(t)
	m.Stall("BatchLookup")
	defer m.Resume()
	// Attaching probes with BatchLookup: a stalled master fails the
	// command within -timeout, with the hint.
	_, errOut := mustRun(t, 1, "", "cluster", "lookup", "-master", m.Addr(), "-timeout", "100ms", "-raw", "k1")
	mustContain(t, "stalled master", errOut, "accepts connections but did not answer within 100ms (-timeout): a stopped process")
}

// Each subcommand's help lists the flags it takes and no other; the
// command's help lists those every subcommand takes, which its errors name.
func TestClusterHelp(t *testing.T) {
	out, _ := mustRun(t, exitOK, "", "cluster", "lookup", "-h")
	mustContain(t, "cluster lookup -h", out, "usage: umbp cluster lookup", "-master", "-raw", "-q", "-tokens", "-topo", "-allow-plaintext")
	for _, not := range []string{"-w-hbm", "-nodes", "make:", "Usage of"} {
		if strings.Contains(out, not) {
			t.Errorf("cluster lookup -h mentions %s:\n%s", not, out)
		}
	}
	out, _ = mustRun(t, exitOK, "", "help", "cluster", "score")
	mustContain(t, "help cluster score", out, "usage: umbp cluster score", "-nodes", "-w-ssd")
	if strings.Contains(out, "-raw") {
		t.Errorf("help cluster score mentions -raw:\n%s", out)
	}
	out, _ = mustRun(t, exitOK, "", "help", "cluster")
	mustContain(t, "help cluster", out, "-master", "-allow-plaintext", "-tls-ca", "-tls-cert", "-tls-key", "-tls-server-name", "-timeout", "umbp help cluster SUBCOMMAND")
}

// Something that is no UMBP master (an HTTP server's 404) is said in
// words, with its answer, not as gRPC's error.
func TestClusterNotAMaster(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true) // gRPC's plaintext: HTTP/2 with prior knowledge
	hs := &http.Server{Handler: http.NotFoundHandler(), Protocols: &h2c}
	go hs.Serve(ln)
	defer hs.Close()
	_, stderr := mustRun(t, exitFail, "", "cluster", "score", "-master", ln.Addr().String(), "-nodes", "n1", "h0")
	want := "umbp cluster score: " + ln.Addr().String() + ` is not a UMBP master: asked for the master's BatchLookup, it answered "unexpected HTTP status code received from server: 404 (Not Found)"; is -master the address of MORI's umbp_master?` + "\n"
	if stderr != want {
		t.Errorf("an HTTP server as the master:\n%s\nwant\n%s", stderr, want)
	}
}

// With several masters and none answering, each is said apart: the
// silent one, and the one no process listens on.
func TestClusterSilentReplicas(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close() // never accepted: as a SIGSTOPped master
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := gone.Addr().String()
	gone.Close()
	_, stderr := mustRun(t, exitFail, "", "cluster", "score", "-master", silent.Addr().String()+","+refused, "-timeout", "200ms", "-nodes", "n1", "h0")
	want := "umbp cluster score: no master answered within 200ms (-timeout): " + silent.Addr().String() +
		" accepts connections but did not answer (a stopped process, or not a UMBP master?); no master listens on " + refused + " (connection refused)"
	if !strings.HasPrefix(stderr, want) || strings.Contains(stderr, silent.Addr().String()+","+refused) {
		t.Errorf("two silent masters:\n%s\nwant %q", stderr, want)
	}
}
