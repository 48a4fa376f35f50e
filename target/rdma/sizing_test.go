package rdma_test

import (
	"strings"
	"testing"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

// softInfo is the soft provider's adapter limits, with cores pinned so
// the test does not depend on the machine.
func softInfo(t *testing.T) transport.AdapterInfo {
	t.Helper()
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	info := a.Info()
	info.Cores = 2
	return info
}

// unshared is info without FlagSRQReceiverWait: an adapter whose empty
// SRQ ends the connection that finds it so (iWARP hardware, siw).
func unshared(info transport.AdapterInfo) transport.AdapterInfo {
	info.Flags &^= transport.FlagSRQReceiverWait
	return info
}

// TestSizeDefaults pins the default sizes on the soft provider, whose
// SRQ holds senders back when empty (FlagSRQReceiverWait): a core's
// receive buffers are DefaultSharedReceives, not one per queue entry of
// every queue, and a core takes 64 queues.
func TestSizeDefaults(t *testing.T) {
	s, err := rdma.Size(softInfo(t), rdma.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, e := s.Limits, s.Engine
	switch {
	case l.MaxIOQueues != 2*64-1:
		t.Errorf("MaxIOQueues %d", l.MaxIOQueues)
	case e.QPsPerCore != 64 || e.Buffers != 1024 || e.SRQDepth != e.Buffers || e.BufferSize != 64+4096 || e.HeaderSize != 64:
		t.Errorf("SRQ: %d QPs per core, %d buffers of %d bytes (header %d), depth %d", e.QPsPerCore, e.Buffers, e.BufferSize, e.HeaderSize, e.SRQDepth)
	case e.CQDepth() != 1024+64*4*256:
		t.Errorf("CQ depth %d", e.CQDepth())
	}
	// 4.06 MiB of receive buffers (split: a 64-byte header and a page
	// each, and one page to align them) + 4 + 8 + 16 MiB of data buffers.
	const want = 1024*(64+4096) + 4096 + (1024*4+64*128+16*1024)<<10
	if got := s.BufferBytesPerCore(); got != want {
		t.Errorf("%d bytes registered per core, want %d", got, want)
	}
}

// TestSizeUnshared pins the default sizes on an adapter whose empty SRQ
// ends the connection (the soft provider's limits otherwise) and the
// per-core memory budget they cost (Size's doc comment states both).
func TestSizeUnshared(t *testing.T) {
	s, err := rdma.Size(unshared(softInfo(t)), rdma.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, e := s.Limits, s.Engine
	switch {
	case l.MaxTransfer != 1<<20 || l.MDTS() != 8:
		t.Errorf("MaxTransfer %d (MDTS %d), want 1 MiB (MDTS 8)", l.MaxTransfer, l.MDTS())
	case l.MaxQueueEntries != 256 || l.AdminQueueEntries != 32 || l.InCapsule != 4096:
		t.Errorf("queue entries %d, admin %d, in capsule %d", l.MaxQueueEntries, l.AdminQueueEntries, l.InCapsule)
	case l.MaxIOQueues != 2*16-1:
		t.Errorf("MaxIOQueues %d", l.MaxIOQueues)
	case e.QPsPerCore != 16 || e.Buffers != 16*256 || e.SRQDepth != e.Buffers || e.BufferSize != 64+4096:
		t.Errorf("SRQ: %d QPs per core, %d buffers of %d bytes, depth %d", e.QPsPerCore, e.Buffers, e.BufferSize, e.SRQDepth)
	case s.ReadSink != rdma.ReadSinkLocal || s.SendSlots != 4:
		t.Errorf("read sink %v with %d send slots per entry: the soft provider's sinks need only local write", s.ReadSink, s.SendSlots)
	case e.InitiatorDepth != 4*256:
		t.Errorf("InitiatorDepth %d", e.InitiatorDepth)
	case e.CQDepth() != 16*256+16*4*256:
		t.Errorf("CQ depth %d", e.CQDepth())
	case s.SmallBuffers != 1024 || s.MidBuffers != 64 || s.MidBufferSize != 128<<10 || s.LargeBuffers != 16:
		t.Errorf("data buffers %d small, %d × %d mid, %d large", s.SmallBuffers, s.MidBuffers, s.MidBufferSize, s.LargeBuffers)
	}
	// 16.25 MiB of receive buffers + 4 + 8 + 16 MiB of data buffers.
	const want = 16*256*(64+4096) + 4096 + (1024*4+64*128+16*1024)<<10
	if got := s.BufferBytesPerCore(); got != want || got > 48<<20 {
		t.Errorf("%d bytes registered per core, want %d (under the 48 MiB budget)", got, want)
	}
	// blk's initiator, like a Linux RDMA host, is never clamped by the
	// default MQES+1 (MAXCMD is the same: TestRawHostAdminAndIO).
	if d := initiator.MaxQueueDepth; uint32(d) > l.MaxQueueEntries {
		t.Errorf("the initiator's deepest queue %d exceeds MQES+1 %d", d, l.MaxQueueEntries)
	}
}

// TestSizeSmallTransfer: with MaxTransfer at most 128 KiB the mid-sized
// class would be the large one, and its buffers join the large ones.
func TestSizeSmallTransfer(t *testing.T) {
	s, err := rdma.Size(unshared(softInfo(t)), rdma.Config{MaxTransfer: 128 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if s.MidBuffers != 0 || s.MidBufferSize != 0 || s.LargeBuffers != 16+64 || s.Limits.MDTS() != 5 {
		t.Errorf("mid %d × %d, large %d, MDTS %d", s.MidBuffers, s.MidBufferSize, s.LargeBuffers, s.Limits.MDTS())
	}
	if got, want := s.BufferBytesPerCore(), uint64(16*256*(64+4096)+4096+(1024*4+80*128)<<10); got != want {
		t.Errorf("%d bytes per core, want %d", got, want)
	}
}

// TestSizeDeepQueues: the configuration for hosts that ask for 1024
// entries (nvmet's NVMET_QUEUE_SIZE) fits the soft provider, at four
// times the receive buffers where they cover every queue full; shared,
// the receive buffers stay 1024 and the default queues per core are as
// many as the CQ holds.
func TestSizeDeepQueues(t *testing.T) {
	s, err := rdma.Size(unshared(softInfo(t)), rdma.Config{QueueEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if s.Limits.MaxQueueEntries != 1024 || s.Engine.Buffers != 16*1024 || s.Engine.CQDepth() != 16*1024+16*4*1024 {
		t.Errorf("entries %d, buffers %d, CQ %d", s.Limits.MaxQueueEntries, s.Engine.Buffers, s.Engine.CQDepth())
	}
	info := softInfo(t)
	s, err = rdma.Size(info, rdma.Config{QueueEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if fit := (uint64(info.MaxCqDepth) - 1024) / (4 * 1024); s.Engine.Buffers != 1024 || uint64(s.Engine.QPsPerCore) != fit || s.Engine.CQDepth() > uint64(info.MaxCqDepth) {
		t.Errorf("shared: buffers %d, %d QPs per core (want %d), CQ %d", s.Engine.Buffers, s.Engine.QPsPerCore, fit, s.Engine.CQDepth())
	}
	// Chosen explicitly, a number of queues the CQ cannot hold is refused.
	if _, err := rdma.Size(info, rdma.Config{QueueEntries: 1024, QPsPerCore: 64}); err == nil || !strings.Contains(err.Error(), "MaxCqDepth") {
		t.Errorf("64 queues of 1024 entries per core: %v, want a refusal naming MaxCqDepth", err)
	}
}

// TestSizeThousandQueues: 1,000 queues of 256 entries (4 engine cores of
// 250) need 256,000 receive buffers (1 GiB) when each queue's are
// reserved, more than an SRQ holds; shared, 4 × 1024 (16 MiB), under a
// tenth of it (issue 13's goal).
func TestSizeThousandQueues(t *testing.T) {
	cfg := rdma.Config{Cores: 4, QPsPerCore: 250}
	if per, err := rdma.Size(unshared(softInfo(t)), cfg); err == nil {
		t.Fatalf("250 reserved queues of 256 per core fit (%d buffers): the CQ cannot hold their reservations", per.Engine.Buffers)
	}
	s, err := rdma.Size(softInfo(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	reserved := uint64(4*250) * 256 * uint64(s.Engine.BufferSize)
	got := uint64(4*s.Engine.Buffers) * uint64(s.Engine.BufferSize)
	if s.Limits.MaxIOQueues != 999 || got*10 > reserved {
		t.Errorf("%d I/O queues; receive buffers %d bytes against %d reserved (%.3fx)", s.Limits.MaxIOQueues, got, reserved, float64(got)/float64(reserved))
	}
}

// TestSizeRefusals: a configuration the adapter cannot hold, or the
// protocol cannot express, is refused with the limit named, never
// clamped.
func TestSizeRefusals(t *testing.T) {
	base := unshared(softInfo(t))
	for _, tc := range []struct {
		name string
		info func(*transport.AdapterInfo)
		cfg  rdma.Config
		want string
	}{
		{"transfer above the adapter's", func(i *transport.AdapterInfo) { i.MaxTransferLength = 512 << 10 }, rdma.Config{}, "MaxTransferLength"},
		{"transfer above a keyed SGL's", nil, rdma.Config{MaxTransfer: 16 << 20}, "keyed SGL"},
		{"transfer not a power of two", nil, rdma.Config{MaxTransfer: 3 << 12}, "power of two"},
		{"SRQ", func(i *transport.AdapterInfo) { i.MaxSrqDepth = 16*256 - 1 }, rdma.Config{}, "MaxSrqDepth"},
		{"CQ", func(i *transport.AdapterInfo) { i.MaxCqDepth = 16*256 + 16*4*256 - 1 }, rdma.Config{}, "MaxCqDepth"},
		{"send queue", func(i *transport.AdapterInfo) { i.MaxInitiatorQueueDepth = 4*256 - 1 }, rdma.Config{}, "MaxInitiatorQueueDepth"},
		{"admin receive queue", func(i *transport.AdapterInfo) { i.MaxReceiveQueueDepth = 31 }, rdma.Config{}, "MaxReceiveQueueDepth"},
		{"registration", func(i *transport.AdapterInfo) { i.MaxRegistrationSize = 8 << 20 }, rdma.Config{}, "MaxRegistrationSize"},
		{"deep queues on a small CQ", func(i *transport.AdapterInfo) { i.MaxCqDepth = 1 << 16 }, rdma.Config{QueueEntries: 1024}, "MaxCqDepth"},
		{"queue entries", nil, rdma.Config{QueueEntries: 65537}, "QueueEntries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := base
			if tc.info != nil {
				tc.info(&info)
			}
			_, err := rdma.Size(info, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestSizeReadSink: how a READ's sink is lent follows the adapter: local
// write only where the adapter says a sink needs no remote right (IB,
// RoCE), registered per READ on iWARP with fast registration, shared (the
// pools remotely writable) on iWARP without it.
func TestSizeReadSink(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mod   func(*transport.AdapterInfo)
		want  rdma.ReadSink
		slots uint32
	}{
		{"sinks need local write only (IB, RoCE, siw, soft)", func(*transport.AdapterInfo) {}, rdma.ReadSinkLocal, 4},
		{"iWARP with fast registration", func(i *transport.AdapterInfo) { i.Flags &^= transport.FlagReadSinkLocal }, rdma.ReadSinkPerRead, 6},
		{"iWARP without fast registration", func(i *transport.AdapterInfo) { i.Flags &^= transport.FlagReadSinkLocal; i.FRMRPageCount = 0 }, rdma.ReadSinkShared, 4},
		{"fast registration too small for MaxTransfer", func(i *transport.AdapterInfo) { i.Flags &^= transport.FlagReadSinkLocal; i.FRMRPageCount = 16 }, rdma.ReadSinkShared, 4},
	} {
		info := softInfo(t)
		tc.mod(&info)
		s, err := rdma.Size(info, rdma.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if s.ReadSink != tc.want || s.SendSlots != tc.slots || s.Engine.InitiatorDepth != tc.slots*256 {
			t.Errorf("%s: %v, %d slots, initiator depth %d; want %v, %d", tc.name, s.ReadSink, s.SendSlots, s.Engine.InitiatorDepth, tc.want, tc.slots)
		}
	}
}
