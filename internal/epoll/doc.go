// Package epoll is the event loop a poll group runs on: one goroutine
// (locked to its OS thread or not: the group's choice) that owns an epoll set of non-blocking sockets
// and sleeps in it when it has nothing to do, and a way for any other
// goroutine to wake it. target/tcp's poll groups and transport/soft's
// (Config.PollGroup) are built on it; what a group does with its events,
// when it chooses to sleep and how it hands work over stay the group's.
//
// A Loop owns three file descriptors: the epoll set, an eventfd that
// wakes it and a timerfd that wakes it at a deadline. Its events carry the
// caller's slot and generation (EpollEvent.Fd and Pad), never the fd, so
// that a slot reused for a new socket can tell a stale event from a live
// one; Slots is that table. The loop's own two fds use negative slots,
// and Wait takes their events itself.
//
// A sleeping loop parks on its epoll fd in Go's netpoller (os.File and
// syscall.RawConn), so that its processor goes to other goroutines at
// once; a blocking epoll_wait would keep the processor until the
// runtime's monitor takes it back, which may be milliseconds.
//
// The wake protocol costs a loop that is awake one atomic store per Wait,
// and a Kick a store and a load: a Kick sets kicked, and writes the
// eventfd only when it finds the loop asleep, once per sleep (the waker
// that wins the compare-and-swap on sleeping writes; the others find it
// cleared). The loop announces its sleep before it looks a last time for
// work handed over, so a Kick is either seen by that look or finds the
// loop asleep and wakes it.
//
// What this package must never do: allocate, lock or make an indirect
// call per event or per Kick of a loop that is awake; import a blk
// package; or decide for the loop when to sleep. It exists on Linux only;
// elsewhere it is empty, and the poll groups that use it are not built.
package epoll
