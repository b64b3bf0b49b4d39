package server

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/umbp-go/umbp-go/internal/fdpass"
)

// acceptFD serves the fd-handoff socket: one registration per connection,
// at most maxFDConns connections at once.
func (s *Server) acceptFD() {
	defer s.wg.Done()
	sem := make(chan struct{}, maxFDConns)
	const minBackoff = 5 * time.Millisecond
	backoff := minBackoff
	for {
		conn, err := s.fdSock.ln.AcceptUnix()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and the like: wait a little, bounded, and retry.
			s.log.Warn("umbp server: accept on the fd socket", "err", err)
			t := time.NewTimer(backoff)
			select {
			case <-s.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = minBackoff
		select {
		case sem <- struct{}{}:
		case <-s.ctx.Done():
			_ = conn.Close()
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			s.serveFD(conn)
		}()
	}
}

// replyTimeout bounds writing a handoff's status.
const replyTimeout = time.Second

// serveFD handles one fd-handoff connection: receive, register, reply, close.
func (s *Server) serveFD(conn *net.UnixConn) {
	defer conn.Close()
	if !s.trackFD(conn) {
		return
	}
	defer s.untrackFD(conn)
	s.fdHandoffs.Add(1)
	status := s.handoff(conn, time.Now().Add(s.opts.FDReceiveTimeout))
	if status != fdpass.StatusOK {
		s.fdRejected.Add(1)
	} else {
		s.fdRegistered.Add(1)
	}
	// The 4-byte status gets a short bound of its own: a client that sent
	// nothing before the receive deadline still gets its -1.
	if err := fdpass.Reply(conn, status, time.Now().Add(min(s.opts.FDReceiveTimeout, replyTimeout))); err != nil {
		s.log.Debug("umbp server: fd handoff reply", "err", err)
	}
}

func (s *Server) handoff(conn *net.UnixConn, deadline time.Time) int32 {
	var refused error
	if gate := s.opts.FDGate; gate != nil {
		refused = gate(s.ctx)
	}
	// The message is read even when the gate refused it, so that the client
	// gets its -1 rather than a broken pipe, and its descriptor is closed.
	reg, f, err := fdpass.Receive(conn, deadline)
	if err != nil {
		if refused == nil && s.ctx.Err() == nil {
			s.log.Warn("umbp server: fd handoff: no valid registration", "err", err)
		}
		return fdpass.StatusFailed
	}
	if refused != nil || s.ops.isClosing() {
		_ = f.Close()
		s.log.Debug("umbp server: fd handoff refused", "client", reg.ClientID, "gate", refused)
		return fdpass.StatusFailed
	}
	// The region belongs to the process that sent it: when that process
	// exits, the region is released (regionTable.reclaim).
	p, perr := peerProc(conn)
	if errors.Is(perr, errPeerGone) {
		_ = f.Close()
		s.log.Debug("umbp server: fd handoff refused", "client", reg.ClientID, "err", perr)
		return fdpass.StatusFailed
	}
	if perr != nil {
		s.log.Warn("umbp server: cannot tell which process registers; its region stays until deregistered",
			"client", reg.ClientID, "err", perr)
	}
	if err := s.registerFD(reg, f, p); err != nil {
		s.log.Warn("umbp server: fd handoff refused", "client", reg.ClientID,
			"worker_base", reg.WorkerBase, "size", reg.Size, "err", err)
		return fdpass.StatusFailed
	}
	s.log.Debug("umbp server: host region registered", "client", reg.ClientID,
		"worker_base", reg.WorkerBase, "size", reg.Size)
	return fdpass.StatusOK
}

// registerFD maps size bytes of the received file and records them as the
// client's region at worker_base, owned by p (nil when unknown; taken over
// in every case). The file must be a regular file (a memfd) at least that
// large: mapping past its end would fault on first touch.
func (s *Server) registerFD(reg fdpass.Registration, f *os.File, p *proc) error {
	defer f.Close()
	taken := false
	defer func() {
		if !taken {
			p.close()
		}
	}()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("descriptor is not a regular file (mode %v)", fi.Mode())
	}
	if fi.Size() < 0 || reg.Size > uint64(fi.Size()) {
		return fmt.Errorf("registration claims %d bytes of a %d-byte file", reg.Size, fi.Size())
	}
	if reg.Size > math.MaxInt {
		return fmt.Errorf("size %d cannot be mapped", reg.Size)
	}
	// No MAP_POPULATE (nor any touch of the pages here): populating a shared
	// writable mapping write-faults every page of the file, so a sparse memfd
	// of gigabytes would be allocated in full, in this process's resident
	// memory, before the handoff is answered. A data op faults in only the
	// pages it copies, once each; its copies survive a fault (runUnit).
	mem, err := unix.Mmap(int(f.Fd()), 0, int(reg.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap %d bytes: %w", reg.Size, err)
	}
	taken = true
	if err := s.regs.addHost(reg.ClientID, reg.WorkerBase, mem, p); err != nil {
		_ = unix.Munmap(mem)
		return err
	}
	return nil
}

func (s *Server) trackFD(c *net.UnixConn) bool {
	s.fdMu.Lock()
	defer s.fdMu.Unlock()
	if s.fdDone {
		return false
	}
	s.fdConns[c] = struct{}{}
	return true
}

func (s *Server) untrackFD(c *net.UnixConn) {
	s.fdMu.Lock()
	defer s.fdMu.Unlock()
	delete(s.fdConns, c)
}

// expireFDConns ends every fd-handoff connection: closing (rather than
// expiring a deadline, which a Receive starting later would reset) makes
// every read or write on it, in progress or to come, fail at once.
func (s *Server) expireFDConns() {
	s.fdMu.Lock()
	defer s.fdMu.Unlock()
	s.fdDone = true
	for c := range s.fdConns {
		_ = c.Close()
	}
}
