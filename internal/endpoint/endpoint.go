// Package endpoint holds the server address the command-line tools use
// when given none.
package endpoint

import "os"

// Default is $UMBP_ENDPOINT, else MORI's node address
// unix:///run/umbp/standalone/<$UMBP_NODE_ID, or node0>.grpc.sock.
func Default() string {
	if ep := os.Getenv("UMBP_ENDPOINT"); ep != "" {
		return ep
	}
	node := os.Getenv("UMBP_NODE_ID")
	if node == "" {
		node = "node0"
	}
	return "unix:///run/umbp/standalone/" + node + ".grpc.sock"
}
