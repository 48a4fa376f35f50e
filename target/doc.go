// Package target is blk's NVMe over Fabrics target core: subsystems and
// their namespaces, the discovery subsystem, controllers and their queues,
// and every fabrics, admin and NVM command a Linux host sends — without
// knowing which transport carries them. A transport binding (target/rdma)
// turns capsules into Requests and hands them to Queue.Execute; the core
// answers through the binding's Responder. request.go is that contract.
//
// # Transports and their limits
//
// One target may serve ports of several transports at once (RDMA, TCP),
// and what a port can move differs: the largest transfer, the in-capsule
// data, the queue sizes, keyed SGLs. Like nvmet, which asks its
// transport per controller, the core takes these Limits from the binding
// with each queue (QueueParams.Limits; Config.Limits only where a
// binding gives none). A controller adopts its admin queue's limits at
// Connect — CAP.MQES, Identify MDTS, IOCCSZ, SGLS and MAXCMD, Number of
// Queues, the I/O queue checks and the transfer check all come from
// them — and accepts I/O queues only from ports with the same limits.
// The discovery log describes each port with its own transport's fields.
//
// # Layout
//
// Files are named for what they do, as in Linux's drivers/nvme/target:
//
//	target.go       Target, ports, subsystem registry, NewQueue
//	budget.go       the controller budget: CNTLIDs, discovery per source and in total
//	subsys.go       Subsystem, hosts, namespaces (copy-on-write table)
//	ctrl.go         controllers: CC/CSTS, teardown, asynchronous events, error log
//	queue.go        Queue: Execute, Close, request completion
//	fabrics_cmd.go  Connect (nvmet's checks, in nvmet's order), Property Get/Set
//	admin_cmd.go    admin dispatch, Identify, Keep Alive, AER, Abort
//	features.go     Get/Set Features
//	features_ctrl.go  features 01h, 02h, 04h, 05h: Arbitration, Power Management,
//	                Temperature Threshold, Error Recovery
//	log.go          Get Log Page: error, SMART, firmware, changed namespaces, effects
//	discovery.go    the discovery controller and its log page
//	remote.go       RemoteSubsystem, SetRemoteSubsystems: other targets' subsystems in the log
//	addr.go         listen and advertised addresses, shared by the bindings
//	events.go       structured events (Config.Logger): controllers, refused Connects
//	ana.go          Asymmetric Namespace Access: SetANAState, its notice, log 0x0C, the I/O status
//	fence.go        admission (SubsystemConfig.Admit, Subsystem.Refuse) and EvictAndDrain, the replication fence
//	io_cmd.go       Read, Write, Flush, Write Zeroes, Dataset Management, Compare
//	resv.go         persistent reservations: ReservationKeeper, LocalReservations, the
//	                view and resvCheck on the I/O path, PublishReservation, DrainHosts,
//	                NotifyReservation (docs/reservations.md §1)
//	resv_cmd.go     Reservation Register, Acquire, Release (at the keeper), Report;
//	                log 0x80 and its event; features 0x81-0x83
//	fused.go        fused Compare and Write: pairing by arrival (Request.Seq,
//	                PrevFuse; Queue.fused), the pair's checks and run
//	rangelock.go    the namespace's striped range lock: plain writes shared,
//	                fused pairs exclusive, parking through IO.Done
//	firstrun.go     FirstRun: which fused firsts of a queue ran, for the
//	                bindings' fused buffer reserve (tcp, rdma)
//	workers.go      the sync worker pool
//	status.go       StatusError, WithStatus; statusOf reads a backend error's status
//	async.go        AsyncBackend, IO, Inline: the asynchronous backend contract
//	delayed.go      DelayedBackend: an asynchronous backend for tests
//	backend.go      Backend (synchronous; write groups included), MemBackend
//	store_backend.go  the store adapter (StoreBackend, StoreIO): the one file
//	                that knows package store, translating its errors (storeStatus)
//	group.go        Group: a binding goroutine's plain writes, committed together,
//	                and its completion sink (SetWake, Reap)
//	stats.go        request states, counters, per-namespace latency histograms
//
// # Concurrency
//
// Execute may be called from any goroutine, for any queue, concurrently.
// The I/O path (Read, Write and the other NVM commands on an I/O queue)
// takes no mutex and allocates nothing (a plain write adds to its
// range's stripes, rangelock.go; only fused commands and the command
// after a fused first look at the queue's pairing table, under its own
// mutex): the controller's readiness, the
// subsystem's namespace table (replaced whole on change) and each
// namespace's reference count are atomics; the backend's own lock is the
// backend's (a store volume takes its RWMutex shared). Each NVM command is
// submitted to the namespace's AsyncBackend as an IO and answered when
// the backend completes it (async.go): a synchronous Backend, through
// Inline, completes at once; an asynchronous one later, and the request
// is then answered on the poll group that submitted it (its Group, which
// the binding reaps) or, without one, on the completing goroutine.
// Commands of a Blocking backend that may wait for a disk sync — Flush,
// FUA writes, FUA Write Zeroes, and the flush of a controller shutdown —
// are submitted on a preallocated pool of sync workers
// (Config.SyncWorkers), never on the binding's goroutine. Admin commands
// run inline under the controller's mutex; they never wait for storage.
//
// Responder.Complete is called exactly once per Execute, on the caller's
// goroutine, a worker's, the goroutine that reaps its Group or the
// backend's, and never with a core lock held, so a binding may execute
// the next command from inside Complete.
//
// Lock order: Target.mu, then Subsystem.mu, then ctrl.mu; Subsystem.nsMu
// is taken alone or before Target.mu. A LocalReservations keeper's lock
// comes before its namespace's reservation lock (resv.go), which is a
// leaf; Subsystem.drainMu comes before Subsystem.qmu. Responder methods are called with
// no lock held.
//
// # Lifetimes
//
// A controller lives from its admin queue Connect until its admin queue
// closes, its keep-alive timer expires, or the target removes it
// (RemoveSubsystem, DenyHost, Close). A discovery controller that sends
// nothing after its Connect lives DiscoveryIdleTimeout at most; how many
// controllers may live, of which discovery ones and per source address,
// is budget.go's. Teardown calls Disconnect on every
// queue of the controller and completes held Asynchronous Event Requests
// with Abort SQ Deleted. Closing an I/O queue only removes it.
//
// # What this package must never do
//
//   - Import a transport (transport/..., target/rdma): a test asserts it.
//   - Block the caller of Execute on a storage sync, or take a mutex or
//     allocate per I/O on the Read/Write path (a test guards allocations).
//   - Complete a request twice, or not at all, whatever races with
//     teardown; touch a request after completing it; answer a request
//     (and so let its binding reuse its buffer) before its backend's
//     IO.Done.
//   - Panic on any command a host can send (a fuzz test drives it).
//   - Know a storage's errors outside its adapter: the store's are
//     translated by storeStatus (store_backend.go, the one file that
//     imports package store, which a test asserts); the core only reads
//     a StatusError back (statusOf), and anything else is an Internal
//     Error.
//   - Close a namespace's backend: the caller owns it.
//   - Keep a Prometheus registry: Stats returns plain counters.
package target
