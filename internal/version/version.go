package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Set by the build where debug.ReadBuildInfo has nothing to say (no .git):
//
//	go build -ldflags "-X github.com/blk-project/blk/internal/version.version=v0.3.0 \
//	  -X github.com/blk-project/blk/internal/version.revision=0123abc" ./cmd/...
//
// Empty means "ask the build info".
var (
	version  string
	revision string
)

// Devel is the version of a binary whose build stamped none: go run, or
// go build with -buildvcs=false (GOFLAGS on some machines).
const Devel = "(devel)"

// Unknown is the revision of a binary built outside a VCS checkout.
const Unknown = "unknown"

// Info is what one build says about itself.
type Info struct {
	Version   string // module version: "v0.3.0", "v0.0.0-20261127124801-1ab3cf9e0c1d+dirty", or Devel
	Revision  string // VCS revision (full hash), or Unknown
	Modified  bool   // the tree had uncommitted changes
	GoVersion string // runtime.Version()
}

// Get returns the running binary's Info: -ldflags values first, then the
// build info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return from(bi, version, revision)
}

// from is Get without the globals, for tests. bi may be nil.
func from(bi *debug.BuildInfo, ldVersion, ldRevision string) Info {
	in := Info{Version: Devel, Revision: Unknown, GoVersion: runtime.Version()}
	if bi != nil {
		if v := bi.Main.Version; v != "" {
			in.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Revision = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if ldVersion != "" {
		in.Version = ldVersion
	}
	if ldRevision != "" {
		in.Revision = ldRevision
	}
	return in
}

// String is the --version line: "v0.3.0 (rev 0123abc, go1.26.0)", with
// "+modified" after the revision when the tree was dirty and Go did not
// already say so in the version.
func (in Info) String() string {
	rev := in.Revision
	if in.Modified && !strings.HasSuffix(in.Version, "+dirty") {
		rev += "+modified"
	}
	return in.Version + " (rev " + rev + ", " + in.GoVersion + ")"
}

// String is Get().String().
func String() string { return Get().String() }
