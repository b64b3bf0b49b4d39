package h2call_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/h2call"
	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// A lookup on a standalone server's Unix socket: the dial function is
// where the server's identity is checked before the first byte; the
// request is encoded before the call, and the reply unmarshalled into
// the message given.
func Example() {
	dir, err := os.MkdirTemp("/tmp", "h2call")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "umbp.grpc.sock")
	srv, err := server.New(server.Options{Endpoint: "unix://" + sock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	c, err := h2call.New(h2call.Options{
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			nc, err := d.DialContext(ctx, "unix", sock)
			// (Check here who serves the socket, and close nc if not
			// trusted: no byte has been sent yet.)
			return nc, err
		},
		MaxReplyBytes: 64 << 20,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	req, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: []string{"a", "b"}})
	var resp umbppb.BatchBoolResponse
	err = c.Invoke(context.Background(), umbppb.UMBPStandalone_BatchExists_FullMethodName, req, &resp)
	fmt.Println(resp.GetOk(), status.Code(err))

	err = c.Invoke(context.Background(), "/umbp.UMBPStandalone/NoSuchMethod", nil, &resp)
	fmt.Println(status.Code(err))
	// Output:
	// [false false] OK
	// Unimplemented
}
