package endpoint

import "testing"

func TestDefault(t *testing.T) {
	t.Setenv("UMBP_ENDPOINT", "")
	t.Setenv("UMBP_NODE_ID", "")
	if got, want := Default(), "unix:///run/umbp/standalone/node0.grpc.sock"; got != want {
		t.Errorf("Default() = %q, want %q", got, want)
	}
	for _, node := range []string{"node3", "n3"} {
		t.Setenv("UMBP_NODE_ID", node)
		if got, want := Default(), "unix:///run/umbp/standalone/"+node+".grpc.sock"; got != want {
			t.Errorf("Default() = %q, want %q", got, want)
		}
	}
	t.Setenv("UMBP_ENDPOINT", "/tmp/a.grpc.sock")
	if got, want := Default(), "/tmp/a.grpc.sock"; got != want {
		t.Errorf("Default() = %q, want %q", got, want)
	}
}
