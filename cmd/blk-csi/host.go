package main

import (
	"errors"

	"github.com/blk-project/blk/csi"
)

// newHost makes the machine's Host for the node service. MERGE (issue 26
// piece 2): the node engineer's csi.NewHost replaces this file's body —
// `return csi.NewHost(cfg)` or what its signature asks.
var newHost = func(cfg csi.Config) (csi.Host, error) {
	return nil, errors.New("the node service's kernel host is not built into this binary yet (issue 26 piece 2): use --mode controller")
}
