package server

import (
	"os"
	"syscall"
)

// owner is a client process that registered regions. A watcher goroutine
// parks on its pidfd in the runtime's poller; when the process exits, its
// regions are retired like a DeregisterMemory's: each is unmapped (or its IPC
// handle reference dropped) at once when no op uses it, else by the last op
// that does. A process's memory can outlive it only through a copy in
// progress.
type owner struct {
	pid   int32
	pidfd *os.File
	rc    syscall.RawConn

	// Guarded by regionTable.mu.
	regions int  // regions in the table it registered
	exited  bool // its watcher saw it exit
	dropped bool // it holds no region any more: its pidfd is closed or closing
}

// hasExited reports whether o's process has exited. Its pidfd must be open
// (o is in regionTable.owners, whose pidfds close only once removed).
func (o *owner) hasExited() bool {
	gone := true
	_ = o.rc.Control(func(fd uintptr) { gone = pidfdExited(int(fd)) })
	return gone
}

// attachLocked records p as r's owner, watching p unless its process is
// watched already (the second pidfd is then closed). t.mu must be held.
func (t *regionTable) attachLocked(r *region, p *proc) {
	if p == nil {
		return
	}
	o := t.owners[p.pid]
	// An owner under the same pid whose process has exited is another
	// process (the pid was reused): the new one gets an owner of its own,
	// and the old owner's watcher still reclaims the old one's regions.
	if o != nil && !o.hasExited() {
		t.toClose = append(t.toClose, p.pidfd)
	} else if o = t.watch(p); o == nil {
		return
	}
	r.owner = o
	o.regions++
}

// watch starts watching p's process and returns its owner, or nil (p's
// pidfd closed, the region left unowned) when the pidfd cannot be waited on.
// t.mu must be held.
func (t *regionTable) watch(p *proc) *owner {
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		t.log.Warn("umbp server: cannot watch a client process; its regions stay until deregistered", "pid", p.pid, "err", err)
		t.toClose = append(t.toClose, p.pidfd)
		return nil
	}
	o := &owner{pid: p.pid, pidfd: p.pidfd, rc: rc}
	t.owners[p.pid] = o
	t.watchers.Add(1)
	t.watching.Add(1)
	go func() {
		defer t.watchers.Done()
		defer t.watching.Add(-1)
		// Read calls the function, and again each time the poller reports
		// the pidfd readable, until it returns true: parked, not polling.
		if err := rc.Read(func(fd uintptr) bool { return pidfdExited(int(fd)) }); err != nil {
			t.mu.Lock()
			dropped := o.dropped
			t.mu.Unlock()
			if !dropped { // else closed on purpose: o holds no region any more
				t.log.Warn("umbp server: cannot watch a client process; its regions stay until deregistered", "pid", o.pid, "err", err)
			}
			return
		}
		t.reclaim(o)
	}()
	return o
}

// detachLocked removes r's ownership as r leaves the table; an owner left
// with no region stops being watched. t.mu must be held.
func (t *regionTable) detachLocked(r *region) {
	o := r.owner
	if o == nil {
		return
	}
	r.owner = nil
	o.regions--
	if o.regions > 0 || o.exited {
		return // an exited owner's watcher closes its pidfd itself
	}
	if t.owners[o.pid] == o {
		delete(t.owners, o.pid)
	}
	o.dropped = true
	t.toClose = append(t.toClose, o.pidfd)
}

// reclaim retires every region o's exited process registered. It runs on
// o's watcher, never on a request's path: it holds t.mu for one pass over
// the regions, and unmaps only regions no op holds.
func (t *regionTable) reclaim(o *owner) {
	var done []*region
	var n int
	var bytes uint64
	clients := make(map[string]struct{})
	t.mu.Lock()
	o.exited = true
	if t.owners[o.pid] == o {
		delete(t.owners, o.pid)
	}
	if o.regions > 0 {
		for client, cr := range t.clients {
			done = append(done, t.retireLocked(cr, client, func(r *region) bool {
				if r.owner != o {
					return false
				}
				n++
				bytes += r.size
				clients[client] = struct{}{}
				return true
			})...)
		}
		t.reclaimedProcs++
		t.reclaimedRegions += uint64(n)
	}
	t.mu.Unlock()
	_ = o.pidfd.Close()
	if n > 0 {
		held := n - len(done)
		t.log.Info("umbp server: client process exited without deregistering; its regions are released",
			"pid", o.pid, "clients", len(clients), "regions", n, "bytes", bytes, "in_use", held)
	}
	t.releaseAll(done)
}
