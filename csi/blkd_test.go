package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/logrec"
	"github.com/blk-project/blk/internal/testport"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The package's tests that need blkd run the real one: built once from
// ../cmd/blkd, started on loopback ports picked free, one per test that
// asks (startBlkd).

var (
	blkdOnce sync.Once
	blkdBin  string
	blkdErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if blkdBin != "" {
		os.RemoveAll(filepath.Dir(blkdBin))
	}
	os.Exit(code)
}

// buildBlkd builds ../cmd/blkd once for the package's tests.
func buildBlkd(t *testing.T) string {
	t.Helper()
	blkdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "csi-test-")
		if err != nil {
			blkdErr = err
			return
		}
		bin := filepath.Join(dir, "blkd")
		out, err := exec.Command("go", "build", "-o", bin, "../cmd/blkd").CombinedOutput()
		if err != nil {
			blkdErr = fmt.Errorf("go build ../cmd/blkd: %v\n%s", err, out)
			return
		}
		blkdBin = bin
	})
	if blkdErr != nil {
		t.Fatal(blkdErr)
	}
	return blkdBin
}

// startBlkd runs one blkd on a temp dir and free loopback ports, waits
// until its GET /readyz answers 200, and returns its API address.
// Without TLS, its API takes this process's user as its own (the
// localAuth rule): the test is blkd's operator.
func startBlkd(t *testing.T, extra ...string) string {
	t.Helper()
	bin := buildBlkd(t)
	api := testport.Addr(t)
	args := append([]string{"--data-dir", t.TempDir(), "--raft-addr", testport.Addr(t), "--nvme-addr", testport.Addr(t),
		"--tcp-addr", testport.Addr(t), "--api-addr", api}, extra...)
	cmd := exec.Command(bin, args...)
	out := &logrec.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("blkd output:\n%s", out.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + api + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return api
			}
		}
		select {
		case <-exited:
			t.Fatalf("blkd exited before ready:\n%s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("blkd not ready within 60 s:\n%s", out.String())
		}
	}
}

// serve runs d's services on a unix socket in dir, with the logging
// interceptor, and returns the socket's address (unix:PATH) and a client
// connection to it. extra registers more services on the same server.
func serve(t *testing.T, d *Driver, extra func(*grpc.Server)) (string, *grpc.ClientConn) {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(UnaryInterceptor(d.log)))
	d.Register(srv)
	if extra != nil {
		extra(srv)
	}
	go srv.Serve(lis)
	t.Cleanup(func() {
		srv.Stop()
		d.Close(context.Background())
	})
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return "unix:" + sock, conn
}

// shortTempDir is a temp dir with a short path: a unix socket's path has
// at most 107 bytes, and t.TempDir's can be longer.
func shortTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// registerHost registers nqn in blkd's host registry (§1.9), as the node
// plugin does at start; a blkd without the registry is left alone.
func registerHost(api, nqn string) error {
	c, err := newBlkAPI(api, "", "")
	if err != nil {
		return err
	}
	err = c.do(context.Background(), http.MethodPost, "/v1/hosts", map[string]string{"host_nqn": nqn, "name": "test"}, nil)
	var ae *apiError
	if err != nil && !(errors.As(err, &ae) && ae.noRoute()) {
		return fmt.Errorf("register host %s: %w", nqn, err)
	}
	return nil
}

// newController is a controller-mode driver of the blkd at api, served;
// it returns the driver and a client of its Controller service.
func newController(t *testing.T, api string) (*Driver, csipb.ControllerClient) {
	t.Helper()
	d, err := New(Config{Mode: ModeController, API: api})
	if err != nil {
		t.Fatal(err)
	}
	_, conn := serve(t, d, nil)
	return d, csipb.NewControllerClient(conn)
}
