package rotation

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/keystate"
)

// TrimRetired removes retired keys from the host's own files, once any
// master's retire-keys tombstoned them in the key record: the public key
// file stops holding them (so that it no longer offers them to publish-key)
// and a backup private key holding one is scrubbed (nothing may sign with a
// retired key again). A missing file is left alone; a public key file that
// would hold no key, or a backup holding the signing key, is not touched.
func (f Files) TrimRetired(retired func(kid string) bool, log logrus.FieldLogger) error {
	var errs []error
	if f.PublicKey != "" {
		errs = append(errs, f.trimPublic(retired, log))
	}
	if f.SigningKey != "" {
		errs = append(errs, f.trimBackup(retired, log))
	}
	return errors.Join(errs...)
}

func (f Files) trimPublic(retired func(kid string) bool, log logrus.FieldLogger) error {
	data, err := os.ReadFile(f.PublicKey)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	blocks, err := publicBlocks(f.PublicKey, data)
	if err != nil {
		return nil // not a key file this can rewrite (a certificate): the publisher's checks speak for it
	}
	var keep []keystate.Item
	var gone []string
	for _, b := range blocks {
		if retired(b.KID) {
			gone = append(gone, b.KID)
			continue
		}
		keep = append(keep, b)
	}
	if len(gone) == 0 {
		return nil
	}
	if len(keep) == 0 {
		return fmt.Errorf("%s holds only retired keys %v: left as it is; put this host's current public key in it", f.PublicKey, gone)
	}
	if _, err := f.writePublic(data, keep); err != nil {
		return fmt.Errorf("trim retired keys from %s: %w", f.PublicKey, err)
	}
	log.WithField("file", f.PublicKey).Infof("retired key(s) %v removed from %s", gone, f.PublicKey)
	return nil
}

func (f Files) trimBackup(retired func(kid string) bool, log logrus.FieldLogger) error {
	kid, err := signingKeyID(f.Backup())
	if err != nil || !retired(kid) {
		return nil
	}
	if cur, err := signingKeyID(f.SigningKey); err == nil && cur == kid {
		return fmt.Errorf("%s holds the signing key %s, which was retired: not removing it; rotate-key gives this host a new key", f.Backup(), kid)
	}
	if err := scrub(f.Backup(), f.SigningKey); err != nil {
		return fmt.Errorf("remove the retired private key %s: %w", f.Backup(), err)
	}
	log.WithField("file", f.Backup()).Infof("retired private key %s overwritten and removed", kid)
	return nil
}
