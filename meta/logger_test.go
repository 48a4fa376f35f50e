package meta

import (
	"errors"
	"log/slog"
	"net"
	"testing"

	"github.com/blk-project/blk/internal/hclogslog"
	"github.com/blk-project/blk/internal/logrec"
)

// TestNodeLogger: with Config.Logger set, raft's own records and its
// network transport's reach that logger (and LogOutput is not needed):
// the election of a bootstrapped node, and a peer that sends the
// transport a command it does not know.
func TestNodeLogger(t *testing.T) {
	var rec logrec.Recorder
	cfg := testConfig(t, "logged", t.TempDir())
	cfg.BindAddr, cfg.Bootstrap = "127.0.0.1:0", true
	cfg.Logger = hclogslog.New(slog.New(&rec))
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	eventually(t, "leader", func() error {
		if !n.IsLeader() {
			return errors.New("not yet")
		}
		return nil
	})
	if r := rec.Wait(t, "entering leader state"); r.Level != slog.LevelInfo {
		t.Errorf("leader record at %v, want INFO", r.Level)
	}
	c, err := net.Dial("tcp", n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte{0xff}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if r := rec.Wait(t, "failed to decode incoming command"); r.Level != slog.LevelError || r.Attrs["error"] != "unknown rpc type 255" {
		t.Errorf("transport record %v", r)
	}
}
