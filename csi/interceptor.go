package csi

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// idGetters are the requests' identifying fields the log line names. A
// request is never logged with %v: a CSI request's secrets map would be
// printed (the spec marks those fields csi_secret).
type (
	volumeIDGetter   interface{ GetVolumeId() string }
	nodeIDGetter     interface{ GetNodeId() string }
	nameGetter       interface{ GetName() string }
	snapshotIDGetter interface{ GetSnapshotId() string }
	sourceVolGetter  interface{ GetSourceVolumeId() string }
)

// UnaryInterceptor logs every call through log: its method, the IDs it
// names, its duration, gRPC code and error text; never its secrets.
// Probe calls that succeed are logged at debug level (the liveness
// sidecar asks every few seconds).
func UnaryInterceptor(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		attrs := append(requestAttrs(req),
			slog.String("method", info.FullMethod),
			slog.Duration("duration", time.Since(start)),
			slog.String("code", status.Code(err).String()))
		level := slog.LevelInfo
		switch {
		case err != nil:
			level = slog.LevelWarn
			attrs = append(attrs, slog.String("err", status.Convert(err).Message()))
		case info.FullMethod == "/csi.v1.Identity/Probe" || info.FullMethod == "/csi.v1.Identity/GetPluginInfo" ||
			info.FullMethod == "/csi.v1.Identity/GetPluginCapabilities":
			level = slog.LevelDebug
		}
		log.LogAttrs(ctx, level, "csi call", attrs...)
		return resp, err
	}
}

// requestAttrs are the identifying fields of a request, by name.
func requestAttrs(req any) []slog.Attr {
	var a []slog.Attr
	add := func(k, v string) {
		if v != "" {
			a = append(a, slog.String(k, v))
		}
	}
	if r, ok := req.(volumeIDGetter); ok {
		add("volume", r.GetVolumeId())
	}
	if r, ok := req.(nameGetter); ok {
		add("name", r.GetName())
	}
	if r, ok := req.(snapshotIDGetter); ok {
		add("snapshot", r.GetSnapshotId())
	}
	if r, ok := req.(sourceVolGetter); ok {
		add("source_volume", r.GetSourceVolumeId())
	}
	if r, ok := req.(nodeIDGetter); ok {
		add("node", r.GetNodeId())
	}
	return a
}
