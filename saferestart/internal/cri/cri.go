// Package cri restarts a static pod's container (kubeadm's kube-apiserver,
// kube-controller-manager) through the container runtime, with the crictl
// binary: find the running container, stop it gracefully so that in-flight
// requests drain, and wait until the kubelet runs a new one. The manifest
// is never edited: the kubelet restarts the container it sees exit, and
// the new container reads the files (keys, bundle) afresh.
//
// crictl's flags and its `ps -o json` output are those of
// sigs.k8s.io/cri-tools v1.37.0 (cmd/crictl/container.go, util.go): `--name`
// and `--namespace` are unanchored regular expressions on the container's
// name and the pod's namespace label, `-o json` is protojson of
// ListContainersResponse with default values emitted (int64 fields such as
// createdAt as strings), and `stop --timeout` is in whole seconds.
package cri

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/runner"
)

// StateRunning is a running container's state in crictl's JSON.
const StateRunning = "CONTAINER_RUNNING"

// namespaceLabel holds a container's pod namespace (kubelet's label, which
// crictl's --namespace matches).
const namespaceLabel = "io.kubernetes.pod.namespace"

// Crictl runs crictl, found on PATH.
type Crictl struct {
	// Endpoint, when set, is passed as --runtime-endpoint; empty leaves the
	// choice to crictl (its config file, then its default sockets).
	Endpoint string
	// Run runs argv and returns its standard output; nil runs it with the
	// project's runner.
	Run func(ctx context.Context, argv []string) ([]byte, error)
}

// Container is one container from `crictl ps -o json`.
type Container struct {
	ID        string
	Name      string
	Namespace string
	State     string
	Attempt   uint32
	CreatedAt int64 // Unix nanoseconds
}

func (c Crictl) base() []string {
	argv := []string{"crictl"}
	if c.Endpoint != "" {
		argv = append(argv, "--runtime-endpoint", c.Endpoint)
	}
	return argv
}

// PsArgv lists the running containers named exactly name in pods of
// exactly namespace (crictl's filters are unanchored regular expressions).
func (c Crictl) PsArgv(name, namespace string) []string {
	return append(c.base(), "ps", "--name", exact(name), "--namespace", exact(namespace), "--state", "running", "-o", "json")
}

// StopArgv stops a container gracefully, killing it after timeout (whole
// seconds, rounded up: crictl's --timeout is an integer number of seconds).
func (c Crictl) StopArgv(id string, timeout time.Duration) []string {
	secs := int64((timeout + time.Second - 1) / time.Second)
	return append(c.base(), "stop", "--timeout", strconv.FormatInt(secs, 10), id)
}

func exact(s string) string { return "^" + regexp.QuoteMeta(s) + "$" }

// ParsePs reads `crictl ps -o json`: protojson of ListContainersResponse.
func ParsePs(data []byte) ([]Container, error) {
	var doc struct {
		Containers []struct {
			ID       string `json:"id"`
			Metadata *struct {
				Name    string `json:"name"`
				Attempt uint32 `json:"attempt"`
			} `json:"metadata"`
			State     string            `json:"state"`
			CreatedAt string            `json:"createdAt"`
			Labels    map[string]string `json:"labels"`
		} `json:"containers"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("crictl ps -o json: %w", err)
	}
	var out []Container
	for i, c := range doc.Containers {
		if c.ID == "" {
			return nil, fmt.Errorf("crictl ps -o json: container %d has no id", i)
		}
		ct := Container{ID: c.ID, State: c.State, Namespace: c.Labels[namespaceLabel]}
		if c.Metadata != nil {
			ct.Name, ct.Attempt = c.Metadata.Name, c.Metadata.Attempt
		}
		if c.CreatedAt != "" {
			n, err := strconv.ParseInt(c.CreatedAt, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("crictl ps -o json: container %s: createdAt %q: %w", c.ID, c.CreatedAt, err)
			}
			ct.CreatedAt = n
		}
		out = append(out, ct)
	}
	return out, nil
}

func (c Crictl) run(ctx context.Context, argv []string) ([]byte, error) {
	if c.Run != nil {
		return c.Run(ctx, argv)
	}
	var stdout bytes.Buffer
	res := runner.Run(ctx, runner.Spec{Argv: argv, Env: nil, OnLine: func(s runner.Stream, line string) {
		if s == runner.Stdout {
			stdout.WriteString(line)
			stdout.WriteByte('\n')
		}
	}})
	if res.Err != nil {
		return nil, fmt.Errorf("%s: %w: %s", runner.Quote(argv), res.Err, strings.Join(res.Tail, " | "))
	}
	return stdout.Bytes(), nil
}

// Running lists the running containers named exactly name in namespace,
// newest first, checking crictl's answer against the filters.
func (c Crictl) Running(ctx context.Context, name, namespace string) ([]Container, error) {
	out, err := c.run(ctx, c.PsArgv(name, namespace))
	if err != nil {
		return nil, err
	}
	all, err := ParsePs(out)
	if err != nil {
		return nil, err
	}
	// A runtime without the name filter must not make us stop another
	// container.
	running := slices.DeleteFunc(all, func(ct Container) bool {
		return !(ct.State == StateRunning && ct.Name == name && (ct.Namespace == "" || ct.Namespace == namespace))
	})
	slices.SortStableFunc(running, func(a, b Container) int { return cmp.Compare(b.CreatedAt, a.CreatedAt) })
	return running, nil
}

// Restart is one restart of a static pod's container.
type Restart struct {
	Crictl      Crictl
	Name        string // container name, e.g. kube-apiserver
	Namespace   string // pod namespace, kube-system
	StopTimeout time.Duration
	// Interval is the pause between looks for the new container (0: 1s).
	Interval time.Duration
	Log      logrus.FieldLogger
}

// ErrNotRunning is a container that is not running at all.
var ErrNotRunning = errors.New("no running container")

// Run stops the running container and waits, until ctx ends, for the
// kubelet to run one with another ID. With none running (crash-looping),
// it only waits for one to run.
func (r Restart) Run(ctx context.Context) error {
	cur, err := r.Crictl.Running(ctx, r.Name, r.Namespace)
	if err != nil {
		return err
	}
	if len(cur) == 0 {
		r.Log.Warnf("no running %s container in %s: waiting for the kubelet to start one", r.Name, r.Namespace)
	} else {
		for _, c := range cur {
			r.Log.Infof("stopping %s container %s (attempt %d), --timeout %s before it is killed", r.Name, short(c.ID), c.Attempt, r.StopTimeout)
			if _, err := r.Crictl.run(ctx, r.Crictl.StopArgv(c.ID, r.StopTimeout)); err != nil {
				return fmt.Errorf("stop %s container %s: %w", r.Name, short(c.ID), err)
			}
		}
		r.Log.Infof("%s stopped; waiting for the kubelet to run a new container (its restart back-off included)", r.Name)
	}
	t := time.NewTicker(cmp.Or(r.Interval, time.Second))
	defer t.Stop()
	for {
		now, err := r.Crictl.Running(ctx, r.Name, r.Namespace)
		if err != nil && ctx.Err() == nil {
			// The runtime may be busy with the restart; the next look decides.
			r.Log.WithError(err).Debug("crictl ps failed; looking again")
		}
		for _, c := range now {
			if !slices.ContainsFunc(cur, func(o Container) bool { return o.ID == c.ID }) {
				r.Log.Infof("kubelet runs a new %s container %s (attempt %d)", r.Name, short(c.ID), c.Attempt)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: no new %s container: %w", ErrNotRunning, r.Name, ctx.Err())
		case <-t.C:
		}
	}
}

// short is an ID as crictl's table shows it.
func short(id string) string { return id[:min(len(id), 13)] }
