// Package etcdclient is the one place both binaries build an etcd v3 client:
// endpoints (or SRV discovery), TLS from files, credentials, and a diagnosis
// of why a connection failed, so that an operator reads "certificate signed
// by unknown authority" instead of "context deadline exceeded".
package etcdclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// New connects to etcd and proves the connection with one read, so that an
// unreachable cluster, a refused certificate or wrong credentials fail here,
// within cfg.DialTimeout (a quarter of it, at most a second, kept to name
// the cause), instead of as "context deadline exceeded" on the first
// request. A zero DialTimeout means DefaultDialTimeout.
func New(ctx context.Context, cfg Config) (*clientv3.Client, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	eps, tc, err := resolve(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	where := strings.Join(eps, ", ")
	// Keep part of the dial timeout to name the cause of a failure, so that
	// New as a whole returns within DialTimeout.
	diagBudget := min(time.Second, cfg.DialTimeout/4)
	deadline := time.Now().Add(cfg.DialTimeout - diagBudget)
	var dialOpts []grpc.DialOption
	if tc != nil {
		// Certificate, key and CA are read again when they change on
		// disk: a renewed certificate needs no restart.
		dialOpts = append(dialOpts, grpc.WithTransportCredentials(newTLSFiles(cfg, tc)))
	}
	// gRPC's default reconnect backoff grows to two minutes; a renewed
	// certificate or a restarted etcd should be picked up within seconds.
	dialOpts = append(dialOpts, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
		MinConnectTimeout: cfg.DialTimeout,
	}))
	// Streams report a lost connection to who asked (WithStreamErrors).
	dialOpts = append(dialOpts, grpc.WithChainStreamInterceptor(reportStreamErrors))
	ccfg := clientv3.Config{
		DialOptions: dialOpts,
		Endpoints:   eps,
		TLS:         tc,
		Username:    cfg.Username,
		Password:    cfg.Password,
		DialTimeout: cfg.DialTimeout,
		// Without keepalive a silently dead member (powered off, partitioned)
		// would hold a watch open forever.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		// The client's own zap logging is retry chatter; errors reach the
		// caller instead.
		Logger: zap.NewNop(),
	}
	if cfg.Username != "" {
		ccfg.DialOptions = append(ccfg.DialOptions, grpc.WithChainUnaryInterceptor(freshAuthenticate(ccfg)))
	}
	cli, err := clientv3.New(ccfg)
	if err == nil {
		probeCtx, cancel := context.WithDeadline(ctx, deadline)
		// Serializable: this proves transport, TLS and credentials; a
		// cluster briefly without leader is for later reads to report.
		_, err = cli.Get(probeCtx, "/", clientv3.WithSerializable(), clientv3.WithCountOnly())
		cancel()
		// Denied means the server checked valid credentials; the user may
		// still read the keys it needs.
		if err == nil || errors.Is(err, rpctypes.ErrPermissionDenied) {
			return cli, nil
		}
		_ = cli.Close()
	}
	if cerr := CertificateProblem(cfg); cerr != nil {
		return nil, fmt.Errorf("etcd %s: %w", where, cerr)
	}
	switch {
	case errors.Is(err, rpctypes.ErrAuthFailed):
		return nil, fmt.Errorf("etcd %s: authentication as user %q failed (check the user name and password): %w", where, cfg.Username, err)
	case errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrInvalidAuthToken):
		return nil, fmt.Errorf("etcd %s requires authentication (give a user name and password): %w", where, err)
	case ctx.Err() != nil:
		return nil, fmt.Errorf("etcd %s: %w", where, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded) || clientv3.IsConnCanceled(err) || IsUnavailable(err):
		dctx, cancel := context.WithTimeout(ctx, diagBudget)
		defer cancel()
		if cause := diagnose(dctx, cfg, eps, tc); cause != nil {
			return nil, fmt.Errorf("etcd %s: no connection within %s: %w", where, cfg.DialTimeout, cause)
		}
		return nil, fmt.Errorf("etcd %s: no answer within %s (endpoints accept connections; cluster unhealthy?): %w", where, cfg.DialTimeout, err)
	default:
		return nil, fmt.Errorf("etcd %s: %w", where, err)
	}
}

// IsUnavailable reports a gRPC Unavailable status: no connection to any
// endpoint right now.
func IsUnavailable(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable
}
