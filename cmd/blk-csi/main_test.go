package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/csi"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func TestFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "both"}, `--mode "both"`},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--mode", "controller", "--endpoint", "http://x"}, "--endpoint"},
		{[]string{"--mode", "controller", "--api", "ftp://x"}, "--api"},
		{[]string{"--mode", "controller", "--api", "https://x:7070"}, "--tls-dir"},
		{[]string{"--mode", "node", "--host-nqn", "not-an-nqn"}, "host NQN"},
		{[]string{"--mode", "node", "--host-nqn", "nqn.2014-08.org.nvmexpress:uuid:0f6b3c52-5b8e-4d38-9e0e-3a3c2a1d6b11", "--state-dir", ""}, "state directory"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		var out, errb bytes.Buffer
		err := newApp(&out, &errb).Run(append([]string{"blk-csi", "--endpoint", "unix://" + filepath.Join(t.TempDir(), "s")}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error with %q", tc.args, err, tc.want)
		}
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := newApp(&out, &out).Run([]string{"blk-csi", "--version"}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "blk-csi version ") || !strings.Contains(out.String(), "(rev ") {
		t.Fatalf("--version: %q", out.String())
	}
}

// TestServe runs the binary in controller mode: it serves the Identity
// and Controller services on its unix socket, Probe fails while blkd is
// unreachable, and SIGTERM stops it cleanly, its socket removed.
func TestServe(t *testing.T) {
	dir, err := os.MkdirTemp("", "blkcsi")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "blk-csi")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "csi.sock")
	cmd := exec.Command(bin, "--endpoint", "unix://"+sock, "--mode", "controller", "--api", "127.0.0.1:1", "--log-format", "text")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket after 20 s:\n%s", logs.String())
		}
	}
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	id := csipb.NewIdentityClient(conn)
	info, err := id.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	if err != nil || info.Name != csi.DriverName || info.VendorVersion == "" {
		t.Fatalf("GetPluginInfo: %v %v", info, err)
	}
	if _, err := id.Probe(ctx, &csipb.ProbeRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Probe with blkd unreachable: %v; want FailedPrecondition", err)
	}
	caps, err := csipb.NewControllerClient(conn).ControllerGetCapabilities(ctx, &csipb.ControllerGetCapabilitiesRequest{})
	if err != nil || len(caps.Capabilities) == 0 {
		t.Fatalf("ControllerGetCapabilities: %v %v", caps, err)
	}
	if _, err := csipb.NewNodeClient(conn).NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("NodeGetInfo in controller mode: %v; want Unimplemented", err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
	if !strings.Contains(logs.String(), "msg=serving") || !strings.Contains(logs.String(), "msg=\"csi call\"") {
		t.Fatalf("logs:\n%s", logs.String())
	}
}
