package etcdclient

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// streamErrKey holds the function WithStreamErrors registers.
type streamErrKey struct{}

// WithStreamErrors returns ctx carrying fn, which the client calls when a
// stream opened under ctx (clientv3 keeps the values of the context a
// watch was opened with) fails for a reason other than its own end or
// cancellation: the connection was lost. clientv3's Watcher reconnects
// such a stream silently and resumes its watches; this lets a caller that
// must log and count the outage (confd's daemon) learn of it at once
// instead of only when a progress request goes unanswered. fn must not
// block.
func WithStreamErrors(ctx context.Context, fn func(error)) context.Context {
	return context.WithValue(ctx, streamErrKey{}, fn)
}

// reportStreamErrors is the stream interceptor behind WithStreamErrors.
func reportStreamErrors(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	fn, _ := ctx.Value(streamErrKey{}).(func(error))
	s, err := streamer(ctx, desc, cc, method, opts...)
	if fn == nil {
		return s, err
	}
	if err != nil {
		report(ctx, fn, err)
		return s, err
	}
	return &reportingStream{ClientStream: s, ctx: ctx, fn: fn}, nil
}

type reportingStream struct {
	grpc.ClientStream
	ctx context.Context // the caller's: gRPC ends the stream's own with it
	fn  func(error)
}

func (s *reportingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		report(s.ctx, s.fn, err)
	}
	return err
}

// report passes err on unless the stream ended as its caller asked.
func report(ctx context.Context, fn func(error), err error) {
	if ctx.Err() != nil || errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
		return
	}
	fn(err)
}
