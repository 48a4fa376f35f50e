// Package version says which build of blk is running: the module version
// and VCS revision Go stamps into the binary (go build -buildvcs=true in a
// git tree), or what the build set with -ldflags -X where there is no .git
// (tarball and container builds).
//
// Both binaries' --version and metrics' blk_build_info read it, so the two
// never disagree. It must never import anything of blk's: every layer may
// use it.
package version
