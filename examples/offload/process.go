package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is the server's process, which the demo stops, continues, kills
// and starts again with the same command line.
// Its methods are safe for concurrent use: an interrupt closes it while the
// demo may be restarting it.
type process struct {
	endpoint string
	argv     []string // how it was started, to start it again
	dir      string
	env      []string
	ours     bool   // the demo started it: it ends it too
	tmp      string // the directory the demo made for its sockets and log
	logPath  string // the server's output

	mu     sync.Mutex
	pid    int
	proc   *os.Process   // the one the demo started, nil for one it was given
	exited chan struct{} // closed once proc has exited
	closed bool          // close ran: nothing is started any more
}

// startProcess starts the project's server as a child process, on a socket
// in a new 0700 directory, with a pool for poolBytes of objects and some
// room besides.
func startProcess(binary string, poolBytes int) (*process, error) {
	bin, err := serverBinary(binary)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "umbp-demo") // mode 0700
	if err != nil {
		return nil, err
	}
	p := &process{
		endpoint: "unix://" + filepath.Join(tmp, "node.grpc.sock"),
		ours:     true,
		tmp:      tmp,
		logPath:  filepath.Join(tmp, "server.log"),
		env:      os.Environ(),
	}
	// The pool is mapped whole at start (-prefault), as a running server's
	// is: no store below pays for the first touch of its pages.
	p.argv = []string{bin, "-endpoint", p.endpoint, "-capacity", strconv.Itoa(2*poolBytes + 64<<20), "-prefault", "-log-level", "warn"}
	if err := p.start(); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	return p, nil
}

// serverBinary finds umbp-standalone-server: the one named, else the one
// beside this program, else the one on PATH.
func serverBinary(named string) (string, error) {
	if named != "" {
		return named, nil
	}
	const name = "umbp-standalone-server"
	if self, err := os.Executable(); err == nil {
		if bin := filepath.Join(filepath.Dir(self), name); isFile(bin) {
			return bin, nil
		}
	}
	if bin, err := exec.LookPath(name); err == nil {
		return bin, nil
	}
	return "", errors.New("no umbp-standalone-server beside this program or on PATH: `make demo` builds both into bin/, or build it (make tool) and give -server bin/umbp-standalone-server")
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// attachProcess describes the server someone started, at endpoint as
// process pid, from what /proc says of it.
func attachProcess(endpoint string, pid int) (*process, error) {
	proc := fmt.Sprintf("/proc/%d/", pid)
	cmdline, err := os.ReadFile(proc + "cmdline")
	if err != nil {
		return nil, fmt.Errorf("-pid %d: %w", pid, err)
	}
	argv := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	if len(argv) == 0 || argv[0] == "" {
		return nil, fmt.Errorf("-pid %d: no command line (a zombie, or a kernel thread)", pid)
	}
	dir, err := os.Readlink(proc + "cwd")
	if err != nil {
		return nil, fmt.Errorf("-pid %d: its working directory: %w", pid, err)
	}
	environ, err := os.ReadFile(proc + "environ")
	if err != nil {
		return nil, fmt.Errorf("-pid %d: its environment: %w", pid, err)
	}
	var env []string
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if len(kv) > 0 {
			env = append(env, string(kv))
		}
	}
	return &process{endpoint: endpoint, pid: pid, argv: argv, dir: dir, env: env}, nil
}

// current returns the process's pid, and its exit channel if the demo
// started it (nil otherwise).
func (p *process) current() (int, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid, p.exited
}

// describe says what the server is.
func (p *process) describe() string {
	pid, _ := p.current()
	if p.ours {
		return fmt.Sprintf("started %s as process %d at %s", filepath.Base(p.argv[0]), pid, p.endpoint)
	}
	return fmt.Sprintf("the server at %s is process %d (%s)", p.endpoint, pid, strings.Join(p.argv, " "))
}

// start starts the process from argv, in dir, with env: a child of the
// demo's own if the demo started the first one, else in a session of its
// own that outlives the demo, its output in a file.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("the demo was interrupted")
	}
	if p.logPath == "" {
		f, err := os.CreateTemp("", "umbp-demo-server-*.log")
		if err != nil {
			return err
		}
		p.logPath = f.Name()
		f.Close()
	}
	out, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = p.dir, p.env, out, out
	if !p.ours {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the server: %w", err)
	}
	exited := make(chan struct{})
	p.pid, p.proc, p.exited = cmd.Process.Pid, cmd.Process, exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return nil
}

// send sends sig to the process: through its *os.Process where the demo
// started it (which refuses once it has exited, so that a reused pid is
// never signalled), else by pid.
func (p *process) send(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
		return p.proc.Signal(sig)
	}
	return syscall.Kill(p.pid, sig)
}

// stop sends SIGSTOP and waits until the process is stopped (delivery is
// asynchronous).
func (p *process) stop() error {
	return p.signal(syscall.SIGSTOP, func(state byte) bool { return state == 'T' })
}

// cont sends SIGCONT and waits until the process runs again.
func (p *process) cont() error {
	return p.signal(syscall.SIGCONT, func(state byte) bool { return state != 'T' })
}

// kill sends SIGKILL and waits until the process is gone.
func (p *process) kill() error {
	pid, exited := p.current()
	if err := p.send(syscall.SIGKILL); err != nil {
		return fmt.Errorf("SIGKILL to process %d: %w", pid, err)
	}
	if exited != nil {
		select {
		case <-exited:
			return nil
		case <-time.After(10 * time.Second):
			return fmt.Errorf("process %d did not exit within 10 s of SIGKILL", pid)
		}
	}
	return p.await("exit", func(state byte) bool { return state == 'Z' || state == 0 })
}

// restart starts the process again as it was started.
func (p *process) restart() error { return p.start() }

func (p *process) signal(sig syscall.Signal, reached func(state byte) bool) error {
	if err := p.send(sig); err != nil {
		pid, _ := p.current()
		return fmt.Errorf("%v to process %d: %w", sig, pid, err)
	}
	return p.await(sig.String(), reached)
}

// await waits, at most 10 s, until the process's state (/proc/PID/stat;
// 0 once it is gone) is one reached accepts.
func (p *process) await(what string, reached func(state byte) bool) error {
	pid, _ := p.current()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var state byte
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			// pid (comm) state ...
			if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
				state = b[i+2]
			}
		}
		if reached(state) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d: no %s within 10 s (state %q)", pid, what, state)
		}
		time.Sleep(time.Millisecond)
	}
}

// close leaves things as they were: a server the demo started is ended and
// its directory removed; one it was given is left running (continued, if
// the demo stopped it), and if the demo restarted it, where its output goes
// is said.
func (p *process) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	pid, exited := p.current()
	if !p.ours {
		_ = p.send(syscall.SIGCONT)
		if exited != nil {
			fmt.Printf("\nthe restarted server runs on as process %d; its output goes to %s\n", pid, p.logPath)
		}
		return
	}
	_ = p.send(syscall.SIGCONT)
	_ = p.send(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = p.send(syscall.SIGKILL)
		<-exited
	}
	_ = os.RemoveAll(p.tmp)
}
