package fdpass

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listen returns a listener on a short socket path and its path.
func listen(t *testing.T) (*net.UnixListener, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "fdp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "x.fd.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

func memfd(t *testing.T, size int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("fdpass-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// serveOne runs fn on the next accepted connection and reports its result.
func serveOne(l *net.UnixListener, fn func(c *net.UnixConn) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			done <- err
			return
		}
		err = fn(c)
		c.Close()
		done <- err
	}()
	return done
}

func TestSendReceive(t *testing.T) {
	l, path := listen(t)
	fd := memfd(t, 8192)
	var got Registration
	var gotSize int64
	done := serveOne(l, func(c *net.UnixConn) error {
		reg, f, err := Receive(c, time.Now().Add(5*time.Second))
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		got, gotSize = reg, st.Size()
		return Reply(c, StatusOK, time.Now().Add(time.Second))
	})
	reg := Registration{ClientID: "c1", WorkerBase: 0x1000, Size: 8192}
	if err := Send(context.Background(), path, fd, reg, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got != reg || gotSize != 8192 {
		t.Fatalf("server got %+v size %d", got, gotSize)
	}
}

func TestSendStatuses(t *testing.T) {
	for _, c := range []struct {
		name   string
		status []byte
		want   error
	}{
		{"refused", []byte{0xff, 0xff, 0xff, 0xff}, ErrRejected},
		{"garbage", []byte{7, 0, 0, 0}, ErrBadReply},
		{"short", []byte{0}, ErrBadReply},
		{"none", nil, ErrBadReply},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, path := listen(t)
			done := serveOne(l, func(conn *net.UnixConn) error {
				_, f, err := Receive(conn, time.Now().Add(5*time.Second))
				if err != nil {
					return err
				}
				f.Close()
				_, err = conn.Write(c.status)
				return err
			})
			err := Send(context.Background(), path, memfd(t, 4096), Registration{ClientID: "c", WorkerBase: 1, Size: 4096}, nil)
			if !errors.Is(err, c.want) {
				t.Fatalf("Send err = %v, want %v", err, c.want)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSendBoundedWhenServerSilent(t *testing.T) {
	l, path := listen(t)
	release := make(chan struct{})
	done := serveOne(l, func(c *net.UnixConn) error { <-release; return nil })
	defer func() { close(release); <-done }()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Send(ctx, path, memfd(t, 4096), Registration{ClientID: "c", WorkerBase: 1, Size: 4096}, nil)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send err = %v, want deadline exceeded", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Send took %v past a 200ms deadline", el)
	}
}

func TestSendPeerCheck(t *testing.T) {
	l, path := listen(t)
	done := serveOne(l, func(c *net.UnixConn) error {
		_, _, err := Receive(c, time.Now().Add(2*time.Second))
		return err
	})
	boom := errors.New("untrusted")
	err := Send(context.Background(), path, memfd(t, 4096), Registration{ClientID: "c", WorkerBase: 1, Size: 4096},
		func(*net.UnixConn) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Send err = %v", err)
	}
	if err := <-done; err == nil {
		t.Fatal("server received a message although the check failed")
	}
}

func TestSendNoListener(t *testing.T) {
	dir, _ := os.MkdirTemp("", "fdp")
	defer os.RemoveAll(dir)
	err := Send(context.Background(), filepath.Join(dir, "none"), 0, Registration{ClientID: "c", WorkerBase: 1, Size: 1}, nil)
	if err == nil {
		t.Fatal("Send to nothing succeeded")
	}
}

// rawSend writes payload with the given descriptors attached, then closes.
func rawSend(t *testing.T, path string, payload []byte, fds []int, thenMore []byte) {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(payload, oob, nil); err != nil {
		t.Fatal(err)
	}
	if thenMore != nil {
		time.Sleep(20 * time.Millisecond)
		if _, err := c.Write(thenMore); err != nil {
			t.Fatal(err)
		}
	}
	var b [4]byte
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, _ = c.Read(b[:])
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

func TestReceiveRejects(t *testing.T) {
	good, _ := goldenReg.Encode()
	badMagic := append([]byte(nil), good...)
	badMagic[0] = 0
	cases := []struct {
		name    string
		payload []byte
		nfds    int
		more    []byte
		ok      bool
	}{
		{"good", good, 1, nil, true},
		{"split", good[:10], 1, good[10:], true},
		{"truncated", good[:50], 1, nil, false},
		{"no fd", good, 0, nil, false},
		{"two fds", good, 2, nil, false},
		{"three fds", good, 3, nil, false},
		{"bad magic", badMagic, 1, nil, false},
		{"too long", append(append([]byte(nil), good...), 1, 2, 3), 1, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, path := listen(t)
			fds := make([]int, c.nfds)
			for i := range fds {
				fds[i] = memfd(t, 4096)
			}
			before := openFDs(t)
			done := serveOne(l, func(conn *net.UnixConn) error {
				_, f, err := Receive(conn, time.Now().Add(2*time.Second))
				if f != nil {
					f.Close()
				}
				status := StatusOK
				if err != nil {
					status = StatusFailed
				}
				_ = Reply(conn, status, time.Now().Add(time.Second))
				return err
			})
			rawSend(t, path, c.payload, fds, c.more)
			err := <-done
			if c.ok != (err == nil) {
				t.Fatalf("Receive err = %v, want ok=%v", err, c.ok)
			}
			// The listener's accepted socket is closed by now; nothing leaked.
			if after := openFDs(t); after > before {
				t.Fatalf("descriptors leaked: %d before, %d after", before, after)
			}
		})
	}
}

func TestReceiveTimeout(t *testing.T) {
	l, path := listen(t)
	done := serveOne(l, func(conn *net.UnixConn) error {
		_, _, err := Receive(conn, time.Now().Add(100*time.Millisecond))
		return err
	})
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Receive from a silent client succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Receive ignored its deadline")
	}
}

func TestReplyEncoding(t *testing.T) {
	a, b, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	if err := Reply(a, StatusFailed, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	var buf [4]byte
	if _, err := b.Read(buf[:]); err != nil {
		t.Fatal(err)
	}
	if int32(binary.LittleEndian.Uint32(buf[:])) != -1 {
		t.Fatalf("reply bytes %x", buf)
	}
}

func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sp")
		defer f.Close()
		c, _ := net.FileConn(f)
		return c.(*net.UnixConn)
	}
	return conv(fds[0]), conv(fds[1]), nil
}
