package umbp

// StandaloneRuntime is a validated configuration that yields handles on one
// umbp_standalone_server. It holds no connection itself: each handle owns
// its own. It is safe for concurrent use.
type StandaloneRuntime struct {
	cfg settings
}

// NewStandaloneRuntime validates cfg, fills in defaults and normalizes the
// endpoint. It does no I/O: the server need not be running yet.
func NewStandaloneRuntime(cfg Config) (*StandaloneRuntime, error) {
	s, err := cfg.settle()
	if err != nil {
		return nil, invalid(err)
	}
	return &StandaloneRuntime{cfg: s}, nil
}

// FDSocketPath is the path of the server's fd-handoff socket, derived from
// the endpoint as servers derive it (docs/PROTOCOL.md, "Sockets").
func (r *StandaloneRuntime) FDSocketPath() string { return r.cfg.fdPath }

// Endpoint returns the normalized server address, "unix:///abs/path".
func (r *StandaloneRuntime) Endpoint() string { return r.cfg.Endpoint }

// Config returns the configuration in effect, defaults filled in.
func (r *StandaloneRuntime) Config() Config {
	c := r.cfg.Config
	c.Tags = append([]string(nil), c.Tags...)
	c.TrustedUIDs = append([]int(nil), c.TrustedUIDs...)
	return c
}

// ClusterRuntime is a validated configuration that yields scheduler handles
// on MORI's UMBP master: the same [SchedulerHandle] a [StandaloneRuntime]
// yields, asking the master instead of a node's server. It holds no
// connection itself: each handle owns its own. It is safe for concurrent
// use.
type ClusterRuntime struct {
	cfg ClusterConfig
}

// NewClusterRuntime validates cfg and fills in defaults. It does no I/O.
// Plaintext to an address that is not loopback is refused unless
// cfg.AllowPlaintext, and the error says why.
func NewClusterRuntime(cfg ClusterConfig) (*ClusterRuntime, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, invalid(err)
	}
	return &ClusterRuntime{cfg: c}, nil
}

// Config returns the configuration in effect, defaults filled in.
func (r *ClusterRuntime) Config() ClusterConfig { return r.cfg }
