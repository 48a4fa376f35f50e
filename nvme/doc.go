// Package nvme is blk's codec for the NVMe and NVMe over Fabrics wire
// structures that the target and the initiator share: the 64-byte
// submission queue entry (command capsule header) and the 16-byte
// completion queue entry, SGL descriptors, opcodes and status codes, the
// Fabrics Connect command and its 1024-byte data, Property Get/Set and the
// controller registers they reach (CAP, VS, CC, CSTS, NSSR), the NVMe/RDMA
// RDMA-CM private data, NQN validation and the discovery log page; and the
// admin and NVM structures a target serves: Identify Controller and
// Namespace and the namespace identification descriptors (identify.go),
// Get Log Page with the Error, SMART, Commands Effects and Changed
// Namespace logs and asynchronous event results (log.go), Get/Set
// Features (features.go), the Read/Write/Write Zeroes/Dataset
// Management fields (nvm.go), and the reservation commands' CDW10 fields
// and key data, the Reservation Status layout constants and the
// Reservation Notification log page (resv.go; the rules are in
// nvme/resv).
//
// Every layout is little-endian and byte-exact against the NVMe base and
// NVMe-oF specifications as restated in shared/docs/nvmeof-wire.md and in
// the Linux headers include/linux/nvme.h and include/linux/nvme-rdma.h;
// the tests pin each offset and the golden captures from
// shared/docs/vm-notes.md.
//
// Encoding writes into a caller-provided fixed-size array
// (Marshal(*[N]byte)); decoding reads from a byte slice (Unmarshal([]byte)).
// Only pre-declared sentinel errors are returned, so neither direction
// allocates.
//
// What this package must never do: perform I/O, know about any transport
// (it encodes the RDMA-CM private data bytes but never touches a queue
// pair), keep state between calls, or allocate on an encode or decode path.
// Policy (which status a target answers, what a host accepts) belongs to
// target/ and initiator/, not here.
package nvme
