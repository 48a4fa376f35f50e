// Package meta is blk's raft-replicated registry: the cluster's nodes, its
// volumes (size, block size, owner, state), each volume's NVMe subsystem
// NQN and allowed hosts, and the live host connections.
//
// The registry is a pure state machine (FSM): Apply is a function of the log
// entry bytes alone, so every replica that applies the same log holds the
// same state and writes a byte-identical snapshot. Time enters only inside
// commands. The raft log and stable store live in one pebble DB (PebbleStore)
// on an injectable vfs.FS; Node wires the FSM, the stores, a snapshot store
// and a transport into a hashicorp/raft instance.
//
// Layout: command.go (versioned command encoding), state.go (the registry
// and one apply function per command), errors.go (the typed results),
// reservation.go (Op 29 and 30, FeatureReservations and its proposal
// gate, docs/reservations.md §1.3), hosts.go (Op 31 and 32, the
// registered hosts, FeatureHosts, docs/operations.md §1.9), fsm.go (raft.FSM), logstore.go (raft.LogStore and raft.StableStore on
// pebble), node.go (Config, Node). Transcripts in testdata/ show each
// command's results; cluster tests run three Nodes in one process.
//
// Names: a new volume name or node ID must fit the name grammar
// (api.CheckName, shared with blkd's API and blkctl), checked where a
// command is proposed (CreateVolume.Check, Node.Apply, AddVoter, a new
// Node); Apply keeps the older, looser check, so a log or snapshot that
// holds a name from before the grammar replays to the same registry.
//
// meta must never import target, transport or any block I/O package: it is
// the control plane, and the data plane depends on it, not the reverse. Of
// blk's packages it imports only api (a leaf: the API's shapes and names)
// and nvme/resv (the pure NVMe reservation model, which reservation.go's
// Op 29 and 30 apply; it imports only nvme's wire constants).
package meta
