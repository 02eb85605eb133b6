package restartcmd

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/cri"
)

// StaticPodArg is the hidden first argument that makes this binary the
// static-pod restart command: it runs under the group guard and
// --restart-timeout like any restart command, so that a helper killed
// mid-restart leaves no crictl behind and the timeout covers the kubelet's
// back-off.
const StaticPodArg = "__static-pod-restart"

// staticPodRestartTimeout is static-pod mode's default --restart-timeout:
// the graceful stop, the kubelet's longest restart back-off for a container
// that exited (CrashLoopBackOff's cap, 5 minutes: a static pod restart may
// wait that long for the kubelet after the stop), and 30 s of slack (pod
// sync, container creation, crictl calls).
func staticPodRestartTimeout(stop time.Duration) time.Duration {
	return stop + 5*time.Minute + 30*time.Second
}

// staticPodCommand runs this binary as the restart command of container
// name's static pod.
func staticPodCommand(endpoint, name string, stop time.Duration) []string {
	self, err := os.Executable()
	if err != nil {
		self = cmdkit.ProgName // found on PATH, as the units run it
	}
	return []string{self, StaticPodArg, "--cri-endpoint", endpoint, "--container", name, "--static-pod-stop-timeout", stop.String()}
}

// StaticPodMain is the static-pod restart command: stop the running
// container through the CRI, wait for the kubelet to run a new one. Its
// deadline is the helper's --restart-timeout (the runner kills its group).
func StaticPodMain(args []string) int {
	fs := pflag.NewFlagSet(StaticPodArg, pflag.ContinueOnError)
	endpoint := fs.String("cri-endpoint", "", "")
	name := fs.String("container", "", "")
	stop := fs.Duration("static-pod-stop-timeout", 30*time.Second, "")
	if err := fs.Parse(args); err != nil || *name == "" || fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s %s: bad arguments %q: %v\n", cmdkit.ProgName, StaticPodArg, args, err)
		return cmdkit.ExitUsage
	}
	log, _ := (&cli.Common{LogLevel: "info", LogFormat: "text"}).Logger(os.Stderr, os.Getenv)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	r := cri.Restart{Crictl: cri.Crictl{Endpoint: *endpoint}, Name: *name, Namespace: "kube-system", StopTimeout: *stop,
		Log: log.WithField("static_pod", *name)}
	if err := r.Run(ctx); err != nil {
		log.WithError(err).Errorf("static pod %s not restarted", *name)
		return 1
	}
	return 0
}
