package store

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Read-only and closed stores, ported from target/volume's tests when it
// was retired.

// TestReadOnlyStore: a store opened read-only serves reads of what was
// written and refuses every change with ErrReadOnly; a flush has nothing
// to do and succeeds.
func TestReadOnlyStore(t *testing.T) {
	cfg := memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512))
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 8, BlockSize4K)
	data := alignedBuf(4096, 4096)
	for i := range data {
		data[i] = byte(i) + 2
	}
	if err := v.Write(3, data, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.ReadOnly = true
	ro := openStore(t, cfg)
	v, err := ro.Volume(1)
	if err != nil {
		t.Fatal(err)
	}
	got := alignedBuf(4096, 4096)
	if err := v.Read(3, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read from a read-only store: %v (equal %v)", err, bytes.Equal(got, data))
	}
	for name, err := range map[string]error{
		"write":        v.Write(3, data, 0),
		"FUA write":    v.Write(4, data, FUA),
		"write zeroes": v.WriteZeroes(3, 1, 0),
		"deallocate":   v.Deallocate(3, 1),
		"create":       func() error { _, err := ro.Create(2, CreateOptions{SizeBytes: 4096}); return err }(),
		"delete":       ro.Delete(1),
		"resize":       ro.Resize(1, 16*4096, false),
		"set state":    ro.SetState(1, StateReadOnly),
	} {
		if !errors.Is(err, ErrReadOnly) {
			t.Errorf("%s in a read-only store = %v, want ErrReadOnly", name, err)
		}
	}
	if err := v.Flush(); err != nil {
		t.Fatalf("flush in a read-only store = %v", err)
	}
	if err := v.Read(3, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after the refusals: %v (equal %v)", err, bytes.Equal(got, data))
	}
}

// TestClosedStore: after Close (twice is fine) every request and every
// administrative call fails with ErrClosed, never reaching pebble or the
// area.
func TestClosedStore(t *testing.T) {
	s, err := Open(memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512)))
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 8, BlockSize4K)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	buf := alignedBuf(4096, 4096)
	for name, err := range map[string]error{
		"read":         v.Read(0, buf),
		"write":        v.Write(0, buf, FUA),
		"write zeroes": v.WriteZeroes(0, 8, 0),
		"deallocate":   v.Deallocate(0, 8),
		"flush":        v.Flush(),
		"store flush":  s.Flush(),
		"delete":       s.Delete(1),
		"resize":       s.Resize(1, 4096, true),
		"set state":    s.SetState(1, StateOnline),
		"create":       func() error { _, err := s.Create(2, CreateOptions{SizeBytes: 4096}); return err }(),
		"volume":       func() error { _, err := s.Volume(1); return err }(),
		"list":         func() error { _, err := s.List(); return err }(),
		"info":         func() error { _, err := v.Info(); return err }(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
}
