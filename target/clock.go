package target

import "time"

// Clock is the target's source of time: the keep-alive timers and the
// SMART power-on hours read it. The default is the real clock; tests
// inject a fake one and move it by hand, so keep-alive expiry is tested
// without sleeping.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f on its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started, and reports whether
	// it did.
	Stop() bool
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
