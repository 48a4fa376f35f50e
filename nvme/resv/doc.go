// Package resv is the NVMe persistent reservation model: the rules of
// Reservation Register, Acquire and Release (NVMe base specification 2.0,
// "Reservations"), Set Features Reservation Persistence, a power loss, the
// access a reservation leaves each host, and the Reservation Status data
// structure, as pure functions over values (docs/reservations.md §1.2).
//
// The registry's FSM (meta, Op 29) calls Apply to change a volume's
// reservation, so every node computes the same state and outcome from the
// log; the target core calls Access to build the view its data path
// reads, and Report to answer Reservation Report; the in-memory keeper of
// tests and standalone targets calls Apply too. One implementation,
// tested without raft or a network.
//
// Files:
//
//	resv.go    types: Type, HostID, Registrant, State, Command, Outcome,
//	           Notice, Rights; Command.Check, Check (the invariants), Clone
//	apply.go   Apply: register, unregister, replace, acquire, preempt,
//	           release, clear, PTPL, power loss; command tokens (Recent);
//	           ClearAll (the operator's break-glass)
//	access.go  Access (what a host may do now) and State.Report
//
// What this package must never do: read a clock, perform I/O, take a
// lock, keep state between calls, or modify a State it was given (Apply
// returns a new one that shares nothing with its input). Which host a
// command comes from, and what a refusal costs on the wire, belong to the
// target; where the state is kept belongs to meta.
package resv
