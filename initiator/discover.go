package initiator

import (
	"context"
	"fmt"

	"github.com/blk-project/blk/nvme"
)

const (
	// discoveryHeaderRead is the length of the first read of the log:
	// 20 bytes (NUMDL 4), as libnvme reads it — GENCTR, NUMREC, RECFMT.
	discoveryHeaderRead = 20
	// discoveryChunk is the window in which entries are read: 4 KiB, as
	// libnvme, and the size of an admin slot's buffer.
	discoveryChunk = adminBufSize
	// discoveryRetries bounds the re-reads when GENCTR changes under the
	// host (libnvme: 10).
	discoveryRetries = 10
	// maxDiscoveryRecords bounds NUMREC (4096 entries = 4 MiB of log).
	maxDiscoveryRecords = 4096
)

// Discover reads the discovery log of the discovery controller at addr
// ("host:port"; if absent the port is 4420 for RDMA, 8009 for TCP, as
// nvme-cli), over Config.Transport, as nvme discover does (§7): it connects
// to the well-known discovery NQN with KATO 0, enables the controller,
// checks Identify (a discovery controller), reads the log header, then
// the entries in 4 KiB windows, then the header again, starting over (up
// to 10 times) if GENCTR changed; then shuts the controller down (CC.SHN)
// and disconnects. cfg's Transport (and Adapter for RDMA, digests for
// TCP), HostNQN, HostID and timeouts are used. Entries keep their TSAS
// raw (DiscoveryLogEntry.TSAS; RDMATSAS decodes the RDMA form; for TCP
// byte 0 is SECTYPE).
func Discover(ctx context.Context, cfg Config, addr string) ([]nvme.DiscoveryLogEntry, error) {
	c, err := newController(cfg, addr, nvme.DiscoveryNQN, true)
	if err != nil {
		return nil, err
	}
	defer c.closeEngine()
	a, err := c.establish(ctx)
	if err != nil {
		return nil, err
	}
	defer c.teardown(a)
	entries, err := a.discoveryLog(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.shutdown(ctx); err != nil {
		c.logf("discovery controller shutdown: %v", err)
	}
	return entries, nil
}

// readLog reads n bytes of log lid at offset off into buf.
func (a *association) readLog(ctx context.Context, lid uint8, off uint64, buf []byte, rae bool) error {
	var cmd nvme.Command
	getLogPageCmd(&cmd, lid, 0, off, len(buf), rae)
	if _, err := a.admin.exec(ctx, &cmd, nil, buf, a.c.cfg.AdminTimeout); err != nil {
		return fmt.Errorf("initiator: Get Log Page %#02x at %d (%d bytes): %w", lid, off, len(buf), err)
	}
	return nil
}

func (a *association) discoveryLog(ctx context.Context) ([]nvme.DiscoveryLogEntry, error) {
	hdrBuf := make([]byte, discoveryHeaderRead)
	chunk := make([]byte, discoveryChunk)
	for attempt := 0; attempt < discoveryRetries; attempt++ {
		var hdr nvme.DiscoveryLogHeader
		if err := a.readLog(ctx, nvme.LogDiscovery, 0, hdrBuf, true); err != nil {
			return nil, err
		}
		hdr.Unmarshal(hdrBuf)
		if hdr.NumRec > maxDiscoveryRecords {
			return nil, fmt.Errorf("%w: discovery log claims %d records", ErrProtocol, hdr.NumRec)
		}
		entries := make([]nvme.DiscoveryLogEntry, hdr.NumRec)
		total := int(hdr.NumRec) * nvme.DiscoveryLogEntrySize
		for done := 0; done < total; {
			n := min(discoveryChunk, total-done)
			off := uint64(nvme.DiscoveryLogHeaderSize + done)
			if err := a.readLog(ctx, nvme.LogDiscovery, off, chunk[:n], true); err != nil {
				return nil, err
			}
			for i := 0; i < n; i += nvme.DiscoveryLogEntrySize {
				entries[(done+i)/nvme.DiscoveryLogEntrySize].Unmarshal(chunk[i:])
			}
			done += n
		}
		var again nvme.DiscoveryLogHeader
		if err := a.readLog(ctx, nvme.LogDiscovery, 0, hdrBuf, false); err != nil {
			return nil, err
		}
		again.Unmarshal(hdrBuf)
		if again.GenCtr == hdr.GenCtr {
			return entries, nil
		}
		a.c.logf("discovery log changed while read (GENCTR %d → %d); reading again", hdr.GenCtr, again.GenCtr)
	}
	return nil, fmt.Errorf("%w: discovery log changed on each of %d reads", ErrProtocol, discoveryRetries)
}
