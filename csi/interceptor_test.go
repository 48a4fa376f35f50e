package csi

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestInterceptorNeverLogsSecrets: a call's line names its method, IDs,
// code and error, and never a secret of its request.
func TestInterceptorNeverLogsSecrets(t *testing.T) {
	var buf bytes.Buffer
	ic := UnaryInterceptor(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	const secret = "DHHC-1:01:c2VjcmV0LXRoYXQtbXVzdC1uZXZlci1iZS1sb2dnZWQ=:"
	req := &csipb.ControllerPublishVolumeRequest{VolumeId: "pvc-1", NodeId: testHost,
		Secrets: map[string]string{secretDHCHAP: secret}, VolumeContext: map[string]string{"k": "v"}}
	info := &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Controller/ControllerPublishVolume"}
	_, err := ic(context.Background(), req, info, func(ctx context.Context, req any) (any, error) {
		return nil, status.Error(codes.NotFound, "volume pvc-1: no such volume")
	})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("the handler's error was changed: %v", err)
	}
	line := buf.String()
	if strings.Contains(line, "c2VjcmV0") || strings.Contains(line, "DHHC") {
		t.Fatalf("a secret was logged: %s", line)
	}
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%v: %s", err, line)
	}
	for k, want := range map[string]string{"msg": "csi call", "level": "WARN", "method": info.FullMethod,
		"volume": "pvc-1", "node": testHost, "code": "NotFound", "err": "volume pvc-1: no such volume"} {
		if rec[k] != want {
			t.Errorf("%s = %v, want %q (line %s)", k, rec[k], want, line)
		}
	}
	if _, ok := rec["duration"]; !ok {
		t.Errorf("no duration: %s", line)
	}
}
