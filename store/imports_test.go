package store

import (
	"testing"

	"github.com/blk-project/blk/internal/importtest"
)

// TestImports: the store sits below the target and beside the transport;
// it imports no other blk package (store/aio will be allowed when it
// lands).
func TestImports(t *testing.T) { importtest.Only(t, ".") }
