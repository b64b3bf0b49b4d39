package umbp

import (
	"errors"
	"fmt"
)

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
		return nil, err
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

// attachError is a failed first attach as a handle's constructor returns
// it: once with the package's prefix and the endpoint (dial's errors carry
// neither, so that the reconnect warnings, which name the endpoint beside
// them, do not say it twice).
func (r *StandaloneRuntime) attachError(err error) error {
	if errors.Is(err, ErrUntrustedServer) {
		return fmt.Errorf("umbp: refusing the UMBP standalone server at %s: %w", r.cfg.Endpoint, err)
	}
	return fmt.Errorf("umbp: cannot attach to the UMBP standalone server at %s: %w", r.cfg.Endpoint, err)
}

// checkHandleArgs validates what every handle constructor takes.
func checkHandleArgs(namespace string, topo RankTopology, layout *KVLayoutDescriptor) error {
	if err := validateNamespace(namespace); err != nil {
		return err
	}
	if err := topo.Validate(); err != nil {
		return err
	}
	if layout != nil {
		if err := layout.Validate(); err != nil {
			return err
		}
	}
	return nil
}
