package providers

import (
	"fmt"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

func init() {
	Register("soft", func(o Options) (transport.Adapter, error) {
		if o.Device != "" {
			return nil, fmt.Errorf("providers: the soft provider drives no device (got %q): it speaks iWARP over the host's TCP stack: %w", o.Device, transport.ErrInvalidParameter)
		}
		a, err := soft.New(soft.Config{})
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return a, nil
	})
}
