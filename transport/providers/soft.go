package providers

import (
	"fmt"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

func init() {
	// soft runs poll-group CQs where the system has them (Linux): each
	// CQ's thread does its QPs' socket I/O, which measured faster for the
	// NVMe target (docs/transport.md); elsewhere a goroutine per QP.
	Register("soft", openSoft(soft.Config{PollGroup: soft.PollGroupsSupported()}))
	// soft-goroutines: the goroutine-per-QP design, to measure against it
	// (or to fall back on).
	Register("soft-goroutines", openSoft(soft.Config{}))
}

func openSoft(cfg soft.Config) Opener {
	return func(o Options) (transport.Adapter, error) {
		if o.Device != "" {
			return nil, fmt.Errorf("providers: the soft provider drives no device (got %q): it speaks iWARP over the host's TCP stack: %w", o.Device, transport.ErrInvalidParameter)
		}
		a, err := soft.New(cfg)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return a, nil
	}
}
