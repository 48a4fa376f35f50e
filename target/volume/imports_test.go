package volume

import (
	"testing"

	"github.com/blk-project/blk/internal/importtest"
)

// TestImports: the block store sits below the target and beside the
// transport; it imports no other blk package.
func TestImports(t *testing.T) { importtest.Only(t, ".") }
