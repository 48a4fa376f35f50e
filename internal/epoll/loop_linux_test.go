//go:build linux

package epoll

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/internal/importtest"
)

func newLoop(t *testing.T, hasWork func() bool) *Loop {
	t.Helper()
	l := new(Loop)
	if err := l.Init("test-loop", hasWork); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.End() })
	return l
}

// pipe returns a pipe's read and write ends, non-blocking.
func pipe(t *testing.T) (r, w int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

// TestKickWakesSleeper: a Kick wakes a parked Wait with one eventfd
// write, which Wait reads itself; the Kicks after it write nothing.
func TestKickWakesSleeper(t *testing.T) {
	l := newLoop(t, nil)
	done := make(chan []unix.EpollEvent)
	go func() { done <- l.Wait(true) }()
	for !l.sleeping.Load() || l.Sleeps() == 0 {
		time.Sleep(time.Millisecond)
	}
	l.Kick()
	l.Kick()
	if evs := <-done; len(evs) != 0 {
		t.Errorf("Wait woken by a Kick returned %v, want no events", evs)
	}
	l.Kick()
	if w, s := l.Wakes(), l.Sleeps(); w != 1 || s != 1 {
		t.Errorf("wakes %d, sleeps %d; want 1, 1", w, s)
	}
	// The eventfd was read: a look finds nothing.
	if evs := l.Wait(false); len(evs) != 0 {
		t.Errorf("Wait(false) after the wake returned %v", evs)
	}
}

// TestNoSleepWithWork: a Wait that would block only looks when a Kick
// came since the last Wait, or hasWork reports work.
func TestNoSleepWithWork(t *testing.T) {
	work := false
	l := newLoop(t, func() bool { return work })
	l.Kick()
	l.Wait(true)
	work = true
	l.Wait(true)
	if w, s := l.Wakes(), l.Sleeps(); w != 0 || s != 0 {
		t.Errorf("wakes %d, sleeps %d; want 0, 0", w, s)
	}
}

// TestEvents: events carry the slot and generation they were added
// with; Mod changes them, Del ends them; the loop's own slots are refused.
func TestEvents(t *testing.T) {
	l := newLoop(t, nil)
	r, w := pipe(t)
	if err := l.Add(r, unix.EPOLLIN, 3, 7); err != nil {
		t.Fatal(err)
	}
	unix.Write(w, []byte{1})
	evs := l.Wait(true)
	if len(evs) != 1 || evs[0].Fd != 3 || evs[0].Pad != 7 || evs[0].Events&unix.EPOLLIN == 0 {
		t.Fatalf("events %+v, want one EPOLLIN of slot 3 gen 7", evs)
	}
	if err := l.Mod(r, unix.EPOLLIN, 4, 8); err != nil {
		t.Fatal(err)
	}
	if evs := l.Wait(false); len(evs) != 1 || evs[0].Fd != 4 || evs[0].Pad != 8 {
		t.Fatalf("events %+v after Mod, want slot 4 gen 8", evs)
	}
	if err := l.Del(r); err != nil {
		t.Fatal(err)
	}
	if evs := l.Wait(false); len(evs) != 0 {
		t.Fatalf("events %+v after Del", evs)
	}
	if err := l.Add(r, unix.EPOLLIN, slotWake, 0); err == nil {
		t.Error("Add with the loop's own slot succeeded")
	}
}

// TestOwnEventsTakenOut: the eventfd's and the timer's events never reach
// the caller, and the caller's around them keep their order.
func TestOwnEventsTakenOut(t *testing.T) {
	l := newLoop(t, nil)
	l.events[0] = unix.EpollEvent{Fd: 5}
	l.events[1] = unix.EpollEvent{Fd: slotWake}
	l.events[2] = unix.EpollEvent{Fd: 6}
	l.events[3] = unix.EpollEvent{Fd: slotTimer}
	l.events[4] = unix.EpollEvent{Fd: 7}
	evs := l.callers(5)
	if len(evs) != 3 || evs[0].Fd != 5 || evs[1].Fd != 6 || evs[2].Fd != 7 {
		t.Errorf("callers(5) = %+v, want slots 5, 6, 7", evs)
	}
}

// TestTimer: a Wait with nothing else to wake it returns at the timer.
func TestTimer(t *testing.T) {
	l := newLoop(t, nil)
	start := time.Now()
	l.SetTimer(2 * time.Millisecond)
	if evs := l.Wait(true); len(evs) != 0 {
		t.Errorf("Wait woken by the timer returned %v", evs)
	}
	if d := time.Since(start); d < 2*time.Millisecond {
		t.Errorf("Wait returned after %v, before the timer", d)
	}
}

// TestEnd: End waits for every Hold to be released; after it, Hold fails
// and a Kick writes nothing.
func TestEnd(t *testing.T) {
	l := new(Loop)
	if err := l.Init("test-loop", nil); err != nil {
		t.Fatal(err)
	}
	if !l.Hold() {
		t.Fatal("Hold on a new loop failed")
	}
	if l.End() {
		t.Fatal("End with a Hold outstanding ended the loop")
	}
	l.Release()
	if !l.End() {
		t.Fatal("End with no Hold did not end the loop")
	}
	if l.Hold() {
		t.Error("Hold on an ended loop succeeded")
	}
	l.sleeping.Store(true) // as a Kick racing End would find it
	l.Kick()
	if l.Wakes() != 0 {
		t.Error("Kick wrote the eventfd of an ended loop")
	}
}

// TestSteadyStateAllocations: a Kick, a Wait that only looks and one that
// parks in the netpoller allocate nothing.
func TestSteadyStateAllocations(t *testing.T) {
	l := newLoop(t, func() bool { return false })
	r, w := pipe(t)
	if err := l.Add(r, unix.EPOLLIN, 0, 0); err != nil {
		t.Fatal(err)
	}
	unix.Write(w, []byte{1}) // level-triggered: readable on every Wait
	if n := testing.AllocsPerRun(1000, func() {
		l.Kick()
		if len(l.Wait(true)) != 1 {
			t.Fatal("no event")
		}
	}); n != 0 {
		t.Errorf("%v allocations per Kick and Wait, want 0", n)
	}
	sleeps := l.Sleeps()
	if n := testing.AllocsPerRun(1000, func() {
		if len(l.Wait(true)) != 1 { // parks, and finds the event at once
			t.Fatal("no event")
		}
	}); n != 0 {
		t.Errorf("%v allocations per sleeping Wait, want 0", n)
	}
	if l.Sleeps() == sleeps {
		t.Error("Wait(true) with no Kick did not park")
	}
}

// TestImportGraph: the loop knows nothing of blk.
func TestImportGraph(t *testing.T) { importtest.Only(t, ".") }
