package blkd

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenStoreLayout: the node's store keeps its metadata in
// <data dir>/volumes and its bytes in <data dir>/volumes.area, created at
// areaInitialBytes; the store's own messages reach the event log and
// pebble's informational ones do not.
func TestOpenStoreLayout(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	s, err := openStore(Config{DataDir: dir}, log)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "volumes")); err != nil || !fi.IsDir() {
		t.Fatalf("metadata directory: %v, %v", fi, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "volumes.area"))
	if err != nil || fi.Size() != areaInitialBytes {
		t.Fatalf("data area: %v, %v; want %d bytes", fi, err, areaInitialBytes)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	l := storeLogger{log}
	buf.Reset()
	l.Infof("[JOB %d] WAL created", 1)
	l.Infof("store: upgrade: volume %d done", 7)
	l.Errorf("background error: %v", "disk")
	out := buf.String()
	if strings.Contains(out, "WAL created") || !strings.Contains(out, "store: upgrade: volume 7 done") ||
		!strings.Contains(out, `level=ERROR msg="store: pebble: background error: disk"`) {
		t.Fatalf("event log:\n%s", out)
	}
}
