package server

// batchObject is an object of a batch request, the i-th key, while its
// copies are in flight: reserved (put) or acquired (get).
type batchObject struct {
	i   int
	o   *object
	err error
}

// putBatch stores a request's new objects. Each is reserved in turn and its
// copies queued on one copy batch; the objects are published (or, where a
// copy failed, aborted) together once the copies are done: at the end, when
// a reservation needs the room they hold, or once they hold an eighth of
// the pool, so that a large request leaves other clients' stores something
// to evict.
type putBatch struct {
	s      *Server
	what   string // the request, for logs
	client string
	keys   []string
	res    []bool // true for each key published
	batch  uint64
	copies copyBatch
	objs   []batchObject
	held   uint64 // bytes of objs
}

// newPutBatch starts a batch for keys, whose outcomes go to res; copies
// sizes its copy list.
func (s *Server) newPutBatch(what, client string, keys []string, res []bool, batch uint64, copies int) *putBatch {
	return &putBatch{s: s, what: what, client: client, keys: keys, res: res, batch: batch,
		copies: s.newCopyBatch(copies), objs: make([]batchObject, 0, len(keys))}
}

// reserve reserves size bytes for key i and returns the object and the item
// to queue its copies under; false when the pool cannot take it.
func (p *putBatch) reserve(i int, size uint64) (*object, int, bool) {
	if p.held > 0 && p.held+size > p.s.pool.capacity/8 {
		p.finish()
	}
	o, err := p.s.pool.reserve(size, p.batch)
	if err != nil && len(p.objs) > 0 {
		// The objects still being filled cannot be evicted: finish them,
		// then try again.
		p.finish()
		o, err = p.s.pool.reserve(size, p.batch)
	}
	if err != nil {
		p.s.log.Debug("umbp server: "+p.what, "key", p.keys[i], "client", p.client, "err", err)
		return nil, 0, false
	}
	p.objs = append(p.objs, batchObject{i: i, o: o})
	p.held += size
	return o, len(p.objs) - 1, true
}

// finish makes the queued copies and publishes the objects they filled, in
// order (a later entry of the same key replaces an earlier one).
func (p *putBatch) finish() {
	p.copies.wait(func(item int, err error) { p.objs[item].err = err })
	for _, b := range p.objs {
		if b.err != nil {
			p.s.log.Warn("umbp server: "+p.what, "key", p.keys[b.i], "client", p.client, "err", b.err)
			p.s.pool.abort(b.o)
			continue
		}
		p.s.pool.publish(p.keys[b.i], b.o)
		p.res[b.i] = true
	}
	p.objs, p.held = p.objs[:0], 0
}

// release gives back the copy list; the batch is finished.
func (p *putBatch) release() { p.copies.release() }

// getBatch loads a request's objects: each stays acquired until the copies,
// made together, are done.
type getBatch struct {
	s      *Server
	what   string // the request, for logs
	client string
	keys   []string
	res    []bool // true for each key loaded
	copies copyBatch
	objs   []batchObject
}

// newGetBatch starts a batch for keys, whose outcomes go to res; copies
// sizes its copy list.
func (s *Server) newGetBatch(what, client string, keys []string, res []bool, copies int) *getBatch {
	return &getBatch{s: s, what: what, client: client, keys: keys, res: res,
		copies: s.newCopyBatch(copies), objs: make([]batchObject, 0, len(keys))}
}

// add holds o, acquired for key i, and returns the item to queue its copies
// under.
func (g *getBatch) add(i int, o *object) int {
	g.objs = append(g.objs, batchObject{i: i, o: o})
	return len(g.objs) - 1
}

// finish makes the copies, releases the objects and gives back the copy
// list.
func (g *getBatch) finish() {
	g.copies.wait(func(item int, err error) { g.objs[item].err = err })
	g.copies.release()
	for _, b := range g.objs {
		g.s.pool.release(b.o)
		if b.err != nil {
			g.s.log.Warn("umbp server: "+g.what, "key", g.keys[b.i], "client", g.client, "err", b.err)
			continue
		}
		g.res[b.i] = true
	}
}
