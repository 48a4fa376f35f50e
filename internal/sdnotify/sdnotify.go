// Package sdnotify tells systemd how a Type=notify service is doing: one
// datagram of NEWLINE-separated VAR=value assignments (READY=1,
// RELOADING=1, STOPPING=1, STATUS=…) sent to the AF_UNIX socket named by
// $NOTIFY_SOCKET (sd_notify(3)). Outside systemd the variable is unset and
// Notify does nothing.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strings"
)

// The assignments blkd sends.
const (
	Ready     = "READY=1"
	Reloading = "RELOADING=1"
	Stopping  = "STOPPING=1"
)

// Status is the STATUS= assignment systemctl status shows.
func Status(s string) string { return "STATUS=" + strings.ReplaceAll(s, "\n", " ") }

// Notify sends the assignments, joined by newlines, in one datagram to
// $NOTIFY_SOCKET: a file system path, or an abstract socket name written
// with a leading '@'. It returns nil without sending when the variable is
// unset, and an error naming the socket when it is set but unusable.
func Notify(states ...string) error {
	return NotifySocket(os.Getenv("NOTIFY_SOCKET"), states...)
}

// NotifySocket is Notify to the socket named socket ("": nothing sent).
func NotifySocket(socket string, states ...string) error {
	if socket == "" || len(states) == 0 {
		return nil
	}
	name := socket
	switch {
	case name[0] == '@':
		name = "\x00" + name[1:] // Go writes abstract names with a leading NUL
	case name[0] != '/':
		return fmt.Errorf("sdnotify: NOTIFY_SOCKET %q: neither a path nor an @abstract name", socket)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sdnotify: %w", err)
	}
	defer conn.Close()
	msg := strings.Join(states, "\n")
	n, err := conn.Write([]byte(msg))
	if err == nil && n != len(msg) {
		err = fmt.Errorf("short write (%d of %d bytes)", n, len(msg))
	}
	if err != nil {
		return fmt.Errorf("sdnotify: %s: %w", socket, err)
	}
	return nil
}
