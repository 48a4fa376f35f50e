package target_test

import (
	"encoding/binary"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// FuzzExecute feeds arbitrary command sequences to a target with a live
// controller: nothing may panic, and every command must be completed
// exactly once (the harness checks when the test ends, after closing
// every queue and the target).
//
// Input: records of 68 bytes: queue selector, data length selector, data
// fill, a spare byte, then the 64-byte SQE. Connect data (length 1024)
// is a valid Connect data for the fixture's host and subsystem, so that
// sequences can reach connected states.
func FuzzExecute(f *testing.F) {
	rec := func(q, l byte, cmd nvme.Command) []byte {
		var sqe [nvme.SQESize]byte
		_ = cmd.Marshal(&sqe)
		return append([]byte{q, l, 0, 0}, sqe[:]...)
	}
	f.Add(rec(1, 0, ioCmd(nvme.IORead, 1, 0, 1, 0)))
	f.Add(append(rec(0, 0, adminCmd(nvme.AdminAsyncEvent)), rec(0, 0, setFeatCmd(nvme.FeatureNumQueues, 0))...))
	f.Add(rec(2, 3, connectCmd(0, 31, 5000)))
	f.Add(append(rec(2, 3, connectCmd(0, 31, 0)), rec(2, 0, propSet(nvme.PropCC, ccEnable))...))
	f.Add(rec(0, 0, propSet(nvme.PropCC, 0x464001)))
	f.Add(rec(1, 5, ioCmd(nvme.IODatasetManagement, 1, 0, 1, 0)))
	f.Add(rec(1, 1, ioCmd(nvme.IOWrite, 1, 3, 1, nvme.RWFUA)))
	f.Add(rec(0, 4, getLogCmd(nvme.LogErrorInfo, 0, 4096, 0, false)))
	f.Add(rec(3, 4, identifyCmd(nvme.CNSController, 0)))
	reg, _ := resvCmd(nvme.IOReservationRegister, nvme.RREGARegister, 0, 0, 0)
	acq, _ := resvCmd(nvme.IOReservationAcquire, nvme.RACQAPreemptAndAbort, 1, 0, 0)
	f.Add(append(rec(1, 5, reg), rec(1, 5, acq)...))
	f.Add(rec(0, 5, getFeatCmd(nvme.FeatureHostID, 0)))
	f.Fuzz(fuzzBody)
}

// fuzzBody runs one input.
func fuzzBody(t *testing.T, b []byte) {
	h := newHarness(t)
	s, _ := h.mustSubsystem(subA, 64)
	if err := s.SetReservations(1, target.LocalReservations(), nil); err != nil { // resv_cmd.go's commands too
		t.Fatal(err)
	}
	admin, cntlid := h.adminConnect("admin", hostA, subA, 5000)
	io := h.ioConnect("io1", 1, hostA, subA, cntlid)
	fresh := h.queue("fresh", target.QueueParams{QID: 0, SQSize: 31})
	disc := h.queue("disc", target.QueueParams{QID: 0, SQSize: 31})
	queues := []*tq{admin, io, fresh, disc}
	lengths := []int{0, 4096, 8192, 1024, 4096 * 2, 16, 512, 4095}
	for len(b) >= 68 {
		r := b[:68]
		b = b[68:]
		var cmd nvme.Command
		_ = cmd.Unmarshal(r[4:])
		q := queues[int(r[0])%len(queues)]
		n := lengths[int(r[1])%len(lengths)]
		if r[1] >= 128 {
			n = int(binary.LittleEndian.Uint16(r[1:3])) % (256 << 10)
		}
		data := make([]byte, n)
		if n == nvme.ConnectDataSize {
			sub := subA
			if q == disc {
				sub = nvme.DiscoveryNQN
			}
			copy(data, connectData(hostA, sub, uint16(cmd.CDW13), hostIDA))
			if r[2]&1 == 0 {
				binary.LittleEndian.PutUint16(data[16:], 0xFFFF)
			}
		} else {
			for i := range data {
				data[i] = r[2]
			}
		}
		// Some commands are held (AERs); their completion is checked
		// at the end.
		h.execMayHold(q, cmd, data)
	}
}
