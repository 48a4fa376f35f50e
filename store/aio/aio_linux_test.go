//go:build linux

package aio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/internal/epoll"
	"github.com/blk-project/blk/internal/importtest"
)

var seedFlag = flag.Uint64("aio.seed", 0, "seed of the randomized tests (0: from the clock)")

// TestImports: the engine is a leaf below the store; it may use only
// internal/lfstack (internal/epoll is the test's, to park the eventfd).
func TestImports(t *testing.T) { importtest.Only(t, ".", "internal/lfstack") }

// kinds runs f once per implementation; the io_uring run skips, saying
// why, where the kernel or a sandbox refuses io_uring.
func kinds(t *testing.T, f func(t *testing.T, k Kind)) {
	for _, k := range []Kind{KindURing, KindWorkers} {
		t.Run(k.String(), func(t *testing.T) {
			if k == KindURing {
				if err := URingUnavailable(); err != nil {
					t.Skipf("io_uring path not tested: %v", err)
				}
			}
			f(t, k)
		})
	}
}

// dataFile opens a fresh O_DIRECT file of size bytes in the test's
// temporary directory; a filesystem without O_DIRECT skips.
func dataFile(t testing.TB, size int64) *File {
	t.Helper()
	f, err := OpenFile(filepath.Join(t.TempDir(), "data"), size)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			t.Skipf("no direct I/O in the temporary directory: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func newEngine(t testing.TB, f *File, cfg Config) Engine {
	t.Helper()
	e, err := New(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func newPool(t testing.TB, size, count int) *Pool {
	t.Helper()
	p, err := NewPool(size, count)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// waitOne sleeps as a poll group does (Arm, then poll the eventfd) until
// completions are there, and reaps them. A minute without one fails: a
// lost wake-up would otherwise hang the test.
func waitOne(t testing.TB, e Engine, cs []Completion) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if n := e.Reap(cs); n > 0 {
			return n
		}
		if e.Arm() {
			continue
		}
		pfd := []unix.PollFd{{Fd: int32(e.EventFD()), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, 1000); err != nil && err != unix.EINTR {
			t.Fatalf("poll eventfd: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no completion within a minute, %d in flight: a lost wake-up", e.InFlight())
		}
	}
}

func seed(t *testing.T) uint64 {
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (replay: go test -run '%s' -aio.seed %d ./store/aio/)", s, t.Name(), s)
		}
	})
	return s
}

// TestRandomReadWrite: seeded random reads, writes (some FUA) and syncs
// at random 4 KiB-aligned offsets and lengths up to 128 KiB, with up to
// depth in flight for depths 1..64, against a model of the file; a read
// returns what the model holds, and at the end the whole file read back
// equals the model. Requests in flight never overlap (the disk orders
// none), so the model is exact.
func TestRandomReadWrite(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		for _, depth := range []int{1, 2, 7, 32, 64} {
			t.Run("depth"+strconv.Itoa(depth), func(t *testing.T) {
				randomRun(t, k, depth, seed(t))
			})
		}
	})
}

func randomRun(t *testing.T, k Kind, depth int, s uint64) {
	const (
		size    = 8 << 20 // 2048 blocks
		blocks  = size / Align
		maxBlks = 32
		ops     = 1500
	)
	rng := rand.New(rand.NewPCG(s, uint64(depth)))
	f := dataFile(t, size)
	e := newEngine(t, f, Config{Kind: k, Depth: depth, Workers: max(1, depth/2+depth%2)})
	pool := newPool(t, maxBlks*Align, depth)
	// io_uring with registered buffers at depths 1, 7 and 64, without
	// at 2 and 32.
	registered := depth%2 == 1 || depth == 64
	if registered {
		if err := e.Register(pool); err != nil {
			t.Fatal(err)
		}
	}
	model := make([]byte, size)
	// Written data comes from windows of seeded noise (a byte loop per
	// write is slow under -race).
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], s)
	key[8] = byte(depth)
	noise := make([]byte, 2*size)
	rand.NewChaCha8(key).Read(noise)
	busy := make([]bool, blocks) // blocks under a request in flight
	type req struct {
		buf      int32
		op       Op
		off, len int
	}
	reqs := map[uint64]req{}
	cs := make([]Completion, depth)
	var tag uint64
	issued, syncs := 0, 0
	for issued < ops || len(reqs) > 0 {
		for issued < ops && len(reqs) < depth {
			if rng.IntN(50) == 0 && syncs < 10 {
				tag++
				if err := e.Sync(tag); err != nil {
					t.Fatal(err)
				}
				reqs[tag] = req{buf: -1, op: OpSync}
				syncs++
				issued++
				continue
			}
			n := 1 + rng.IntN(maxBlks)
			b := rng.IntN(blocks - n + 1)
			free := true
			for i := b; i < b+n; i++ {
				free = free && !busy[i]
			}
			if !free {
				break // try again when something completes
			}
			idx, buf, ok := pool.Get()
			if !ok {
				t.Fatal("pool empty with fewer than depth requests in flight")
			}
			buf = buf[:n*Align]
			off := b * Align
			tag++
			var err error
			op := OpRead
			if rng.IntN(10) < 6 {
				op = OpWrite
				copy(buf, noise[rng.IntN(len(noise)-len(buf)):])
				copy(model[off:], buf)
				fua := rng.IntN(8) == 0
				if fua {
					op = OpWriteFUA
				}
				err = e.Write(tag, buf, int64(off), fua)
			} else {
				err = e.Read(tag, buf, int64(off))
			}
			if err != nil {
				t.Fatalf("queue %v of %d blocks at block %d: %v", op, n, b, err)
			}
			for i := b; i < b+n; i++ {
				busy[i] = true
			}
			reqs[tag] = req{buf: idx, op: op, off: off, len: n * Align}
			issued++
		}
		if err := e.Submit(); err != nil {
			t.Fatal(err)
		}
		if len(reqs) == 0 {
			continue
		}
		n := waitOne(t, e, cs)
		for _, c := range cs[:n] {
			r, ok := reqs[c.Tag]
			if !ok {
				t.Fatalf("completion of unknown tag %d", c.Tag)
			}
			delete(reqs, c.Tag)
			if c.Op != r.op || int(c.Len) != r.len {
				t.Fatalf("tag %d completed as %v of %d bytes, submitted as %v of %d", c.Tag, c.Op, c.Len, r.op, r.len)
			}
			if err := c.Err(); err != nil {
				t.Fatalf("tag %d (%v of %d bytes at %d): %v", c.Tag, c.Op, r.len, r.off, err)
			}
			if r.op == OpSync {
				continue
			}
			buf := pool.Buf(r.buf)[:r.len]
			if r.op == OpRead && !bytes.Equal(buf, model[r.off:r.off+r.len]) {
				t.Fatalf("read of %d bytes at %d (tag %d) differs from what was written", r.len, r.off, c.Tag)
			}
			for i := r.off / Align; i < (r.off+r.len)/Align; i++ {
				busy[i] = false
			}
			pool.Put(r.buf)
		}
	}
	// The whole file, read back.
	for off := 0; off < size; {
		idx, buf, _ := pool.Get()
		if err := e.Read(uint64(off), buf, int64(off)); err != nil {
			t.Fatal(err)
		}
		if err := e.Submit(); err != nil {
			t.Fatal(err)
		}
		waitOne(t, e, cs[:1])
		if err := cs[0].Err(); err != nil {
			t.Fatalf("read back at %d: %v", off, err)
		}
		if !bytes.Equal(buf, model[off:off+len(buf)]) {
			t.Fatalf("read back at %d differs from the model", off)
		}
		off += len(buf)
		pool.Put(idx)
	}
	st := e.Stats()
	if st.Completed != st.Submitted || st.Errors != 0 {
		t.Fatalf("stats %+v: completions differ from submissions, or errors", st)
	}
	if k == KindURing && (st.Fixed > 0) != registered {
		t.Fatalf("registered %v, but %d requests went on registered buffers", registered, st.Fixed)
	}
}

// TestRegister: on a registered pool io_uring uses its fixed-buffer
// requests, other buffers keep working, and data crosses between them;
// a second pool or a closed engine is refused.
func TestRegister(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		f := dataFile(t, 1<<20)
		e := newEngine(t, f, Config{Kind: k, Depth: 2})
		fixed, other := newPool(t, 8*Align, 1), newPool(t, 8*Align, 1)
		if err := e.Register(fixed); err != nil {
			t.Fatal(err)
		}
		a, b := fixed.Buf(0), other.Buf(0)
		rand.NewChaCha8([32]byte{1}).Read(a)
		cs := make([]Completion, 1)
		do := func(what string, queue func() error) {
			if err := queue(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			e.Submit()
			waitOne(t, e, cs)
			if err := cs[0].Err(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		do("write from the registered pool", func() error { return e.Write(1, a, 8*Align, false) })
		do("read into another buffer", func() error { return e.Read(2, b, 8*Align) })
		if !bytes.Equal(a, b) {
			t.Fatal("data written from a registered buffer reads back different")
		}
		do("write from another buffer", func() error { return e.Write(3, b[:Align], 0, true) })
		do("read into the registered pool", func() error { return e.Read(4, a[Align:2*Align], 0) })
		if !bytes.Equal(a[Align:2*Align], b[:Align]) {
			t.Fatal("data read into a registered buffer differs")
		}
		if fx := e.Stats().Fixed; k == KindURing && fx != 2 {
			t.Errorf("%d requests on registered buffers, want 2", fx)
		}
		if err := e.Register(other); k == KindURing && err == nil {
			t.Error("a second pool was registered")
		}
		e.Close()
		if err := e.Register(other); !errors.Is(err, ErrClosed) {
			t.Errorf("register on a closed engine: %v, want ErrClosed", err)
		}
	})
}

// TestRefusedBeforeSubmit: a misaligned buffer, offset or length, an
// empty or oversized request, and a request past Depth are refused with
// a clear error, and nothing reaches the disk.
func TestRefusedBeforeSubmit(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		f := dataFile(t, 1<<20)
		e := newEngine(t, f, Config{Kind: k, Depth: 2})
		p := newPool(t, 2*Align, 2)
		_, buf, _ := p.Get()
		cases := []struct {
			name string
			buf  []byte
			off  int64
			want string
		}{
			{"address", buf[512 : 512+Align], 0, "buffer address"},
			{"length", buf[:Align+512], 0, "length 4608"},
			{"offset", buf[:Align], 512, "offset 512"},
			{"negative offset", buf[:Align], -Align, "offset -4096"},
			{"empty", buf[:0], 0, "length 0"},
		}
		for _, c := range cases {
			for _, write := range []bool{false, true} {
				var err error
				if write {
					err = e.Write(1, c.buf, c.off, false)
				} else {
					err = e.Read(1, c.buf, c.off)
				}
				if !errors.Is(err, ErrAlign) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s (write %v): %v, want ErrAlign naming %q", c.name, write, err, c.want)
				}
			}
		}
		if e.InFlight() != 0 || e.Stats().Unaligned != uint64(2*len(cases)) {
			t.Fatalf("refused requests left %d in flight, stats %+v", e.InFlight(), e.Stats())
		}
		// Depth 2: a third request is refused until one is reaped.
		for i := range 2 {
			if err := e.Read(uint64(i), buf[:Align], 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Sync(3); !errors.Is(err, ErrFull) {
			t.Fatalf("third request at depth 2: %v, want ErrFull", err)
		}
		if err := e.Submit(); err != nil {
			t.Fatal(err)
		}
		cs := make([]Completion, 2)
		for got := 0; got < 2; {
			got += waitOne(t, e, cs)
		}
		if err := e.Sync(3); err != nil {
			t.Fatalf("after reaping: %v", err)
		}
	})
}

// TestTooLarge: a request above MaxIO is refused (the table above cannot
// build one from a MaxIO pool without a second mapping).
func TestTooLarge(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		f := dataFile(t, 4<<20)
		e := newEngine(t, f, Config{Kind: k, Depth: 1})
		p, err := NewPool(MaxIO, 2) // contiguous: two buffers make one of 2 MiB
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		buf := p.mem[:MaxIO+Align]
		if err := e.Read(1, buf, 0); !errors.Is(err, ErrAlign) || !strings.Contains(err.Error(), "length 1052672") {
			t.Fatalf("read of MaxIO+4096: %v, want ErrAlign", err)
		}
	})
}

// TestPastEOF: a read at the end of the file completes with ErrShort and
// no bytes; one that straddles it with the bytes before the end.
func TestPastEOF(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		const size = 1 << 20
		f := dataFile(t, size)
		e := newEngine(t, f, Config{Kind: k, Depth: 4})
		p := newPool(t, 2*Align, 2)
		_, a, _ := p.Get()
		_, b, _ := p.Get()
		if err := e.Read(1, a, size); err != nil {
			t.Fatal(err)
		}
		if err := e.Read(2, b, size-Align); err != nil {
			t.Fatal(err)
		}
		e.Submit()
		cs := make([]Completion, 2)
		got := map[uint64]Completion{}
		for len(got) < 2 {
			n := waitOne(t, e, cs)
			for _, c := range cs[:n] {
				got[c.Tag] = c
			}
		}
		if c := got[1]; !errors.Is(c.Err(), ErrShort) || c.N != 0 {
			t.Errorf("read at EOF: N %d, %v; want 0 bytes, ErrShort", c.N, c.Err())
		}
		if c := got[2]; !errors.Is(c.Err(), ErrShort) || c.N != Align {
			t.Errorf("read across EOF: N %d, %v; want %d bytes, ErrShort", c.N, c.Err(), Align)
		}
	})
}

// TestKernelError: an error the kernel returns reaches the completion as
// its errno. The file descriptor is closed under the engine (EBADF),
// the one error path every machine can produce; EIO needs a faulty
// device (dm-error, root) and is not tested here.
func TestKernelError(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		f := dataFile(t, 1<<20)
		e := newEngine(t, f, Config{Kind: k, Depth: 2})
		p := newPool(t, Align, 1)
		_, buf, _ := p.Get()
		unix.Close(f.fd) // not f.Close: the engine still names the fd
		f.closed.Store(true)
		if err := e.Read(1, buf, 0); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(2); err != nil {
			t.Fatal(err)
		}
		e.Submit()
		cs := make([]Completion, 2)
		for got := 0; got < 2; {
			n := waitOne(t, e, cs)
			for _, c := range cs[:n] {
				if !errors.Is(c.Err(), unix.EBADF) {
					t.Errorf("%v on a closed fd: %v, want EBADF", c.Op, c.Err())
				}
			}
			got += n
		}
		if st := e.Stats(); st.Errors != 2 {
			t.Errorf("stats count %d errors, want 2", st.Errors)
		}
	})
}

// TestClosed: Close waits for the requests in flight, then every call
// says ErrClosed (Reap finds nothing); a second Close is harmless.
func TestClosed(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		f := dataFile(t, 4<<20)
		e, err := New(f, Config{Kind: k, Depth: 8})
		if err != nil {
			t.Fatal(err)
		}
		p := newPool(t, 128<<10, 8)
		for i := range 8 {
			_, buf, _ := p.Get()
			if err := e.Write(uint64(i), buf, int64(i)*(128<<10), false); err != nil {
				t.Fatal(err)
			}
		}
		e.Submit()
		if err := e.Close(); err != nil {
			t.Fatalf("close with 8 in flight: %v", err)
		}
		_, buf, _ := newPool(t, Align, 1).Get()
		for name, err := range map[string]error{
			"read":   e.Read(1, buf, 0),
			"write":  e.Write(1, buf, 0, true),
			"sync":   e.Sync(1),
			"submit": e.Submit(),
		} {
			if !errors.Is(err, ErrClosed) {
				t.Errorf("%s after Close: %v, want ErrClosed", name, err)
			}
		}
		if n := e.Reap(make([]Completion, 4)); n != 0 || e.Arm() {
			t.Errorf("after Close: Reap %d, Arm true", n)
		}
		if err := e.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

// TestEventFDInLoop: the engine's eventfd parked in a poll group's
// epoll.Loop, with Arm as the loop's last look before sleeping, wakes
// the loop for every completion: 200 reads one at a time, each waited
// for by a blocking Wait.
func TestEventFDInLoop(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		f := dataFile(t, 1<<20)
		e := newEngine(t, f, Config{Kind: k, Depth: 1})
		var l epoll.Loop
		if err := l.Init("aio-test", e.Arm); err != nil {
			t.Fatal(err)
		}
		defer l.End()
		if err := l.Add(e.EventFD(), unix.EPOLLIN, 0, 0); err != nil {
			t.Fatal(err)
		}
		p := newPool(t, Align, 1)
		_, buf, _ := p.Get()
		cs := make([]Completion, 1)
		done := make(chan struct{})
		go func() { // a watchdog: a lost wake-up fails instead of hanging
			select {
			case <-done:
			case <-time.After(time.Minute):
				l.Kick()
				t.Error("no wake-up within a minute")
			}
		}()
		defer close(done)
		for i := range 200 {
			if err := e.Read(uint64(i), buf, int64(i%256)*Align); err != nil {
				t.Fatal(err)
			}
			e.Submit()
			for e.Reap(cs) == 0 {
				if t.Failed() {
					return
				}
				l.Wait(true)
			}
			if cs[0].Tag != uint64(i) || cs[0].Err() != nil {
				t.Fatalf("completion %+v, want tag %d without error", cs[0], i)
			}
		}
	})
}

// TestArmDrains: after a completion is reaped, Arm leaves the eventfd
// unreadable (a poll group would otherwise wake at once, for ever), and
// the next completion makes it readable.
func TestArmDrains(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		f := dataFile(t, 1<<20)
		e := newEngine(t, f, Config{Kind: k, Depth: 1})
		p := newPool(t, Align, 1)
		cs := make([]Completion, 1)
		readable := func(ms int) bool {
			pfd := []unix.PollFd{{Fd: int32(e.EventFD()), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, ms)
			if err != nil && err != unix.EINTR {
				t.Fatal(err)
			}
			return n == 1
		}
		for i := range 20 {
			if e.Arm() {
				t.Fatalf("round %d: Arm found work with nothing in flight", i)
			}
			if readable(0) {
				t.Fatalf("round %d: eventfd readable after Arm with nothing in flight", i)
			}
			if err := e.Read(uint64(i), p.Buf(0), 0); err != nil {
				t.Fatal(err)
			}
			e.Submit()
			if !e.Arm() && !readable(60_000) {
				t.Fatalf("round %d: no signal within a minute", i)
			}
			if n := e.Reap(cs); n != 1 || cs[0].Tag != uint64(i) {
				t.Fatalf("round %d: reaped %d, tag %d", i, n, cs[0].Tag)
			}
		}
	})
}

// TestAuto: KindAuto takes io_uring exactly where it is available.
func TestAuto(t *testing.T) {
	f := dataFile(t, 1<<20)
	e := newEngine(t, f, Config{})
	want := KindURing
	if err := URingUnavailable(); err != nil {
		want = KindWorkers
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("reason %v does not wrap ErrUnavailable", err)
		}
		t.Logf("io_uring unavailable here: %v", err)
	}
	if e.Kind() != want || e.Depth() != DefaultDepth {
		t.Fatalf("auto engine: %v depth %d, want %v depth %d", e.Kind(), e.Depth(), want, DefaultDepth)
	}
}

// TestExplainSetup: each way io_uring_setup fails names its cause.
func TestExplainSetup(t *testing.T) {
	for errno, want := range map[unix.Errno]string{
		unix.ENOSYS: "seccomp",
		unix.EPERM:  "EPERM",
		unix.ENOMEM: "RLIMIT_MEMLOCK",
		unix.EINVAL: "invalid argument",
	} {
		err := explainSetup(&osSyscallError{errno})
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v, want ErrUnavailable naming %q", errno, err, want)
		}
	}
}

type osSyscallError struct{ errno unix.Errno }

func (e *osSyscallError) Error() string { return "io_uring_setup: " + e.errno.Error() }
func (e *osSyscallError) Unwrap() error { return e.errno }

// TestConfig: defaults and the limits Validate enforces.
func TestConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, ""},
		{Config{Depth: 1}, ""},
		{Config{Depth: MaxDepth}, ""},
		{Config{Depth: MaxDepth + 1}, "Depth 4097"},
		{Config{Depth: -1}, "Depth -1"},
		{Config{Depth: 4, Workers: 5}, "Workers 5"},
		{Config{Kind: 9}, "Kind 9"},
	} {
		err := c.cfg.Validate()
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	if c := (Config{}).withDefaults(); c.Depth != DefaultDepth || c.Workers != DefaultDepth {
		t.Errorf("defaults %+v", c)
	}
}

// TestPool: buffers are page-aligned, distinct, all handed out once,
// and a double Put panics.
func TestPool(t *testing.T) {
	p := newPool(t, 0, 0)
	if p.Size() != DefaultBufSize || p.Free() != DefaultBufCount {
		t.Fatalf("default pool: %d buffers of %d", p.Free(), p.Size())
	}
	seen := map[*byte]bool{}
	for range DefaultBufCount {
		idx, buf, ok := p.Get()
		if !ok || len(buf) != DefaultBufSize || seen[&buf[0]] || check(buf, 0) != nil {
			t.Fatalf("buffer %d: ok %v len %d repeated %v aligned %v", idx, ok, len(buf), seen[&buf[0]], check(buf, 0))
		}
		seen[&buf[0]] = true
	}
	if _, _, ok := p.Get(); ok {
		t.Fatal("Get from an empty pool succeeded")
	}
	p.Put(3)
	defer func() {
		if recover() == nil {
			t.Fatal("a double Put did not panic")
		}
	}()
	p.Put(3)
}

// TestOpenFile: preallocation, and the errors that name the problem.
func TestOpenFile(t *testing.T) {
	dir := t.TempDir()
	f, err := OpenFile(filepath.Join(dir, "d"), 8<<20)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	if n, err := f.Size(); err != nil || n != 8<<20 {
		t.Fatalf("size %d, %v; want 8 MiB", n, err)
	}
	f.Close()
	if _, err := f.Size(); !errors.Is(err, ErrClosed) {
		t.Errorf("size after close: %v", err)
	}
	if _, err := OpenFile(filepath.Join(dir, "odd"), 1000); !errors.Is(err, ErrAlign) {
		t.Errorf("size 1000: %v, want ErrAlign", err)
	}
	if _, err := OpenFile(dir, 0); err == nil {
		t.Errorf("opening a directory succeeded")
	}
	if _, err := OpenFile(filepath.Join(dir, "no", "such"), 0); err == nil || !strings.Contains(err.Error(), "no/such") {
		t.Errorf("missing directory: %v, want the path named", err)
	}
}
