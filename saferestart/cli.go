package saferestart

import "github.com/keysync/confd/internal/config"

// defaultConfig is --config's default, read only when present. A variable
// so that tests never read the real one.
var defaultConfig = config.DefaultPath

// Subcommands; restart is the default.
const (
	cmdRestart = "restart"
	cmdStatus  = "status"
	cmdHold    = "hold"
	cmdUnhold  = "unhold"
	cmdCheck   = "check"
	cmdVersion = "version"
	// Service-account key trust and rotation (internal/keycmd).
	cmdTrust       = "trust"
	cmdWaitTrusted = "wait-trusted"
	cmdRotateKey   = "rotate-key"
	cmdRetireKeys  = "retire-keys"
	cmdPublishKey  = "publish-key"
	// Removing a master for good (internal/keycmd).
	cmdForgetHost = "forget-host"
	// The effective configuration and where each value came from.
	cmdConfig = "config"
)
