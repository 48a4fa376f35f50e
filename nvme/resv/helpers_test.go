package resv

import (
	"reflect"
	"testing"

	"github.com/blk-project/blk/internal/importtest"
)

func equalState(a, b State) bool { return reflect.DeepEqual(a, b) }

// TestImports: the model imports the wire package and nothing else of blk.
func TestImports(t *testing.T) { importtest.Only(t, ".", "nvme") }
