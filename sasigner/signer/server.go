package signer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	externaljwtv1 "k8s.io/externaljwt/apis/v1"
)

// Service implements ExternalJWTSigner over a KeySet.
type Service struct {
	externaljwtv1.UnimplementedExternalJWTSignerServer
	Keys *KeySet
	// RefreshHint is FetchKeys' refresh_hint_seconds: how soon the
	// apiserver asks again (it also asks at once for an unknown kid).
	RefreshHint        time.Duration
	MaxTokenExpiration time.Duration
	Log                logrus.FieldLogger
	Metrics            *Metrics
	// Fetched, if set, is called with every snapshot FetchKeys served (the
	// trust barrier records what its apiserver fetched).
	Fetched func(*Snapshot)

	// oversize is the last snapshot whose answer was logged as too large.
	oversize atomic.Pointer[Snapshot]
}

// Sign signs the apiserver's claims with the current signing key.
func (s *Service) Sign(_ context.Context, req *externaljwtv1.SignJWTRequest) (*externaljwtv1.SignJWTResponse, error) {
	start := time.Now()
	k := s.Keys.Signer()
	if k == nil {
		// A new master's key is not trusted everywhere yet: a token it
		// signed now would be refused by other masters.
		s.Metrics.signs.WithLabelValues("unavailable").Inc()
		return nil, status.Error(codes.Unavailable, "the signing key is not yet fetched by every host's apiserver (trust barrier)")
	}
	header, sig, err := k.Sign(req.GetClaims())
	switch {
	case errors.Is(err, ErrBadClaims):
		s.Metrics.signs.WithLabelValues("invalid").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		s.Metrics.signs.WithLabelValues("error").Inc()
		s.Log.WithError(err).WithField("kid", k.KeyID).Error("sign")
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.Metrics.signs.WithLabelValues("ok").Inc()
	s.Metrics.signTime.Observe(time.Since(start).Seconds())
	return &externaljwtv1.SignJWTResponse{Header: header, Signature: sig}, nil
}

// MaxFetchKeysAnswer is the largest FetchKeys answer kube-apiserver takes:
// its client keeps gRPC's default receive limit (4 MiB), about 12,000
// RSA-2048 or 30,000 P-256 keys (TestFetchKeysAnswerSize).
const MaxFetchKeysAnswer = 4 << 20

// FetchKeys serves the current key set from memory. It records the
// answer's size, and logs an answer over MaxFetchKeysAnswer once per
// snapshot: the apiserver refuses it and keeps the keys it fetched before,
// so no key change reaches it.
func (s *Service) FetchKeys(context.Context, *externaljwtv1.FetchKeysRequest) (*externaljwtv1.FetchKeysResponse, error) {
	snap := s.Keys.Snapshot()
	s.Metrics.fetches.Inc()
	resp := &externaljwtv1.FetchKeysResponse{
		Keys:               make([]*externaljwtv1.Key, len(snap.Keys)),
		DataTimestamp:      timestamppb.New(snap.Time),
		RefreshHintSeconds: int64(s.RefreshHint / time.Second),
	}
	for i, k := range snap.Keys {
		// Every key may be used by some master to sign bound tokens, so
		// none is excluded from OIDC discovery (the apiserver refuses a
		// token signed with an excluded key).
		resp.Keys[i] = &externaljwtv1.Key{KeyId: k.ID, Key: k.DER}
	}
	n := proto.Size(resp)
	s.Metrics.answer.Set(float64(n))
	if n > MaxFetchKeysAnswer && s.oversize.Swap(snap) != snap {
		s.Log.WithField("bytes", n).WithField("keys", len(snap.Keys)).WithField("limit", MaxFetchKeysAnswer).
			Error("FetchKeys answer over kube-apiserver's 4 MiB gRPC receive limit: the apiserver refuses it and keeps the keys it fetched before; retire keys (retire-keys) to get under it")
	}
	if s.Fetched != nil {
		s.Fetched(snap)
	}
	return resp, nil
}

// Metadata tells the apiserver the longest token lifetime we sign.
func (s *Service) Metadata(context.Context, *externaljwtv1.MetadataRequest) (*externaljwtv1.MetadataResponse, error) {
	return &externaljwtv1.MetadataResponse{MaxTokenExpirationSeconds: int64(s.MaxTokenExpiration / time.Second)}, nil
}

// NewGRPCServer returns a gRPC server serving s.
func NewGRPCServer(s *Service) *grpc.Server {
	g := grpc.NewServer()
	externaljwtv1.RegisterExternalJWTSignerServer(g, s)
	return g
}

// Listen opens the Unix socket at path, in a directory of its own that a
// static-pod apiserver mounts, so that it sees a restarted signer's new
// socket; the directories are checked first (prepareSocketDir). A stale
// socket (no one answers) is removed; a live one, or a path that is not a
// socket, is an error. The socket is mode 0660, group gid (-1: unchanged),
// which must reach it.
func Listen(ctx context.Context, path string, gid int) (net.Listener, error) {
	if err := prepareSocketDir(path, gid); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket %s: exists and is not a socket (%s); not removing it", path, fi.Mode().Type())
		}
		c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "unix", path)
		if err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("socket %s: another process is serving it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("stale socket %s: %w", path, err)
		}
	}
	l, err := (&net.ListenConfig{}).Listen(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("socket %s: group %d: %w", path, gid, err)
		}
		if err := checkSocketGroup(path, gid); err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	return l, nil
}
