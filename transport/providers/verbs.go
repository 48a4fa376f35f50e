//go:build verbs && linux && cgo

package providers

import (
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/verbs"
)

func init() {
	Register("verbs", func(o Options) (transport.Adapter, error) {
		a, err := verbs.New(verbs.Config{Device: o.Device})
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return a, nil
	})
}
