package etcdclient

import (
	"context"
	"fmt"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

const authenticateMethod = "/etcdserverpb.Auth/Authenticate"

// freshAuthenticate is a gRPC interceptor that sends Authenticate over a
// connection of its own, which carries no token. etcd 3.4 checks the token
// attached to every request, Authenticate included, so the client
// library's re-authentication after the token expired (--auth-token-ttl)
// is itself refused as "invalid auth token", and every later request
// fails: this is what makes username/password sessions survive the TTL on
// 3.4. On 3.5+ it is merely harmless. Re-authentication happens once per
// token lifetime, so a short-lived connection costs nothing.
func freshAuthenticate(base clientv3.Config) grpc.UnaryClientInterceptor {
	// The first Authenticate carries no token yet: it needs no detour.
	var hasToken atomic.Bool
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != authenticateMethod {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if !hasToken.Load() {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil {
				hasToken.Store(true)
			}
			return err
		}
		cfg := base
		cfg.Username, cfg.Password = "", "" // no token on this connection
		cfg.Context = ctx
		side, err := clientv3.New(cfg)
		if err != nil {
			return fmt.Errorf("authenticate: %w", err)
		}
		defer side.Close()
		resp, err := pb.NewAuthClient(side.ActiveConnection()).Authenticate(ctx, req.(*pb.AuthenticateRequest))
		if err != nil {
			return err
		}
		proto.Merge(reply.(*pb.AuthenticateResponse), resp)
		return nil
	}
}
