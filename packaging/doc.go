// Package packaging holds no code the binaries use: its directory is the
// release packaging (nfpm.yaml, the packages' changelog and maintainer
// scripts, run by `make dist`), and its tests hold `make install` and
// `make dist` to what docs/operations.md and docs/kubeadm.md promise: every
// unit and example in place, nothing armed, each kind of master's units
// apart.
package packaging
