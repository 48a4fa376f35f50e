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

// DiscoveryWatch is a persistent discovery controller, as nvme discover
// --persistent and nvme connect-all keep one: connected with
// Config.KATO and kept alive, with discovery log change notices (OAES
// bit 31) enabled; each notice is delivered on Changed, and Log reads the
// log again (which re-arms the notice: the controller masks it until the
// log is read). It does not reconnect: Down closes when the association
// fails, and the caller watches again.
type DiscoveryWatch struct {
	c *Controller
	a *association
}

// WatchDiscovery connects a persistent discovery controller at addr as
// Discover does (its port defaults alike), and enables the discovery log
// change notice. A controller that does not offer the notice (OAES bit
// 31 clear) is refused with ErrProtocol.
func WatchDiscovery(ctx context.Context, cfg Config, addr string) (*DiscoveryWatch, error) {
	c, err := newController(cfg, addr, nvme.DiscoveryNQN, true)
	if err != nil {
		return nil, err
	}
	c.discNotice = make(chan struct{}, 1)
	a, err := c.establish(ctx)
	if err != nil {
		c.closeEngine()
		return nil, err
	}
	return &DiscoveryWatch{c: c, a: a}, nil
}

// watchDiscovery enables the discovery log change notice and arms an
// Asynchronous Event Request.
func (a *association) watchDiscovery(ctx context.Context) error {
	if a.id.OAES&nvme.AENDiscoveryLogs == 0 {
		return fmt.Errorf("%w: %s offers no discovery log change notice (OAES %#x)", ErrProtocol, a.c.addr, a.id.OAES)
	}
	var cmd nvme.Command
	setFeaturesCmd(&cmd, nvme.FeatureAsyncEventConfig, nvme.AENDiscoveryLogs)
	if _, err := a.admin.exec(ctx, &cmd, nil, nil, a.c.cfg.AdminTimeout); err != nil {
		return fmt.Errorf("initiator: Async Event Configuration: %w", err)
	}
	a.armAER()
	return nil
}

// Log reads the discovery log, as Discover does.
func (w *DiscoveryWatch) Log(ctx context.Context) ([]nvme.DiscoveryLogEntry, error) {
	return w.a.discoveryLog(ctx)
}

// Changed receives a value after a discovery log change notice; several
// notices before a receive are one.
func (w *DiscoveryWatch) Changed() <-chan struct{} { return w.c.discNotice }

// Down closes when the association fails (a lost connection, a
// keep-alive timeout).
func (w *DiscoveryWatch) Down() <-chan struct{} { return w.a.done }

// Close shuts the discovery controller down (CC.SHN) and disconnects.
func (w *DiscoveryWatch) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), w.c.shutdownTimeout(w.a))
	defer cancel()
	err := w.a.shutdown(ctx)
	w.c.teardown(w.a)
	w.c.closeEngine()
	return err
}
