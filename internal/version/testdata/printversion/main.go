// Command printversion prints what internal/version reports, for
// TestLdflags.
package main

import (
	"fmt"

	"github.com/blk-project/blk/internal/version"
)

func main() { fmt.Print(version.Get().Version, " ", version.Get().Revision) }
