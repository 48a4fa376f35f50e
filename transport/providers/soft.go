package providers

import (
	"fmt"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

func init() {
	Register("soft", openSoft(soft.Config{}))
	// soft-poll: the same with poll-group CQs (each CQ's thread does its
	// QPs' socket I/O; Linux only), to measure against the default.
	Register("soft-poll", openSoft(soft.Config{PollGroup: true}))
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
