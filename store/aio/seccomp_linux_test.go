//go:build linux

package aio

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccompChild is set in the environment of the child process that
// TestSeccompFallback starts under a seccomp filter.
const seccompChild = "BLK_AIO_SECCOMP_CHILD"

// denyURing installs, for every thread of the process, a seccomp filter
// that fails io_uring_setup with ENOSYS, as a container runtime's
// default profile does.
func denyURing() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_IO_URING_SETUP, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog))); errno != 0 {
		return errno
	}
	return nil
}

// TestSeccompFallback runs TestSeccompChild in a child process whose
// io_uring_setup a seccomp filter refuses: io_uring is reported
// unavailable with the reason, KindAuto falls back to the workers, and
// they move data.
func TestSeccompFallback(t *testing.T) {
	if os.Getenv(seccompChild) != "" {
		t.Skip("in the child")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestSeccompChild$", "-test.v", "-test.count", "1")
	cmd.Env = append(os.Environ(), seccompChild+"=1")
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "seccomp unavailable:") {
		t.Skipf("cannot install a seccomp filter here: %s", out)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: TestSeccompChild") {
		t.Fatalf("child under seccomp: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", out)
}

// TestSeccompChild is TestSeccompFallback's child; it runs only there.
func TestSeccompChild(t *testing.T) {
	if os.Getenv(seccompChild) == "" {
		t.Skip("runs only as TestSeccompFallback's child")
	}
	err := URingUnavailable()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "ENOSYS") || !strings.Contains(err.Error(), "seccomp") {
		t.Fatalf("io_uring under a seccomp filter: %v, want ErrUnavailable naming ENOSYS and seccomp", err)
	}
	t.Logf("reason given: %v", err)
	f := dataFile(t, 1<<20)
	if _, err := New(f, Config{Kind: KindURing}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("KindURing under seccomp: %v, want ErrUnavailable", err)
	}
	e := newEngine(t, f, Config{})
	if e.Kind() != KindWorkers {
		t.Fatalf("KindAuto under seccomp: %v, want workers", e.Kind())
	}
	p := newPool(t, Align, 2)
	a, b := p.Buf(0), p.Buf(1)
	copy(a, "written under seccomp")
	cs := make([]Completion, 1)
	for _, q := range []func() error{
		func() error { return e.Write(1, a, 4*Align, true) },
		func() error { return e.Read(2, b, 4*Align) },
	} {
		if err := q(); err != nil {
			t.Fatal(err)
		}
		e.Submit()
		waitOne(t, e, cs)
		if err := cs[0].Err(); err != nil {
			t.Fatal(err)
		}
	}
	if string(b[:21]) != "written under seccomp" {
		t.Fatalf("read back %q", b[:21])
	}
}
