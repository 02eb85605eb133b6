package apply

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/keysync/confd/internal/lockdir"
)

// DefaultDestLockTimeout is how long a pass waits for another confd's pass
// over the same destination (-dest-lock-timeout).
const DefaultDestLockTimeout = time.Minute

// lockPoll is how often a waiting pass tries the lock again: flock has no
// timeout, and a blocked flock cannot be interrupted.
const lockPoll = 20 * time.Millisecond

// DefaultLockDir is where the destinations' locks are (-lock-dir): one
// directory for every confd of a user on the host, whatever its confdir or
// unit, so that they all agree on each destination's lock. Not beside the
// destination: a directory that Puppet purges (or that holds only what an
// operator put there) must stay as confd 0.16 left it. root's is
// /run/confd/locks; another user's is $TMPDIR/confd-UID-locks, where it
// may create it (as its command locks, $TMPDIR/confd-UID-commands).
func DefaultLockDir() string {
	if uid := os.Geteuid(); uid != 0 {
		return filepath.Join(os.TempDir(), fmt.Sprintf("confd-%d-locks", uid))
	}
	return "/run/confd/locks"
}

// errNoDestDir says dest's directory does not exist: nothing to lock, nor
// to write.
var errNoDestDir = errors.New("no destination directory")

// lockPath is the lock of dest in lockDir, which it creates if missing:
// one per destination, whatever confdir or resource writes it, so that
// every confd process on the host agrees. The name is the SHA-256 of the
// destination's path with its directory's symlinks resolved (two spellings
// of one file share a lock, as they shared the lock file beside it), then
// its base name for a reader of the directory.
func lockPath(lockDir, dest string) (string, error) {
	abs, err := filepath.Abs(dest)
	if err != nil {
		return "", err
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if errors.Is(err, fs.ErrNotExist) {
		return "", errNoDestDir
	}
	if err != nil {
		return "", fmt.Errorf("lock of %s: %w", dest, err)
	}
	if err := lockdir.Ensure(lockDir); err != nil {
		return "", fmt.Errorf("lock directory (-lock-dir, confd.toml lock_dir): %w", err)
	}
	base := filepath.Base(abs)
	sum := sha256.Sum256([]byte(filepath.Join(dir, base)))
	if len(base) > 64 { // the name stays far below NAME_MAX
		base = base[:64]
	}
	return filepath.Join(lockDir, hex.EncodeToString(sum[:16])+"-"+base+".lock"), nil
}

// LockedError says another process held a destination's lock for longer
// than the wait allowed.
type LockedError struct {
	Dest string
	PID  int // 0 when the holder had not written its PID yet
	Wait time.Duration
}

func (e *LockedError) Error() string {
	who := "another confd"
	if e.PID > 0 {
		who = fmt.Sprintf("another confd (PID %d)", e.PID)
	}
	return fmt.Sprintf("%s is being written by %s, still after -dest-lock-timeout %s; left to it", e.Dest, who, e.Wait)
}

// lockDest takes dest's lock, waiting up to wait (0: not at all), until
// ctx ends or until stop closes (confd is stopping: a pass not begun is
// not begun for a lock either). The lock file, in lockDir, holds the last
// holder's PID, for the error of those who wait in vain. It stays after
// release: removing it made the close free its inode, a journal commit
// that cost a changed pass about 1 ms on ext4; a crashed holder's lock is
// free all the same (flock dies with its process).
// Without dest's directory there is nothing to lock, nor to write: the
// pass goes on unlocked and says what is wrong where it needs the
// directory (closing a nil lock is a no-op). A lock directory that cannot be
// used fails the pass: going on unlocked would let two confds write one
// destination at once.
func lockDest(ctx context.Context, lockDir, dest string, wait time.Duration, stop <-chan struct{}, log logrus.FieldLogger) (*os.File, error) {
	p, err := lockPath(lockDir, dest)
	if errors.Is(err, errNoDestDir) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for try := 0; ; try++ {
		l, err := tryLock(p)
		if l != nil && try > 0 {
			log.Infof("Got the lock of %s after %s; going on with this pass", dest, time.Since(start).Round(time.Millisecond))
		}
		if err != nil || l != nil {
			return l, err
		}
		if try == 0 {
			log.Infof("Waiting up to %s (-dest-lock-timeout) for the lock of %s: another confd (PID %d) is writing it", wait, dest, holder(p))
		}
		if time.Since(start) >= wait {
			return nil, &LockedError{Dest: dest, PID: holder(p), Wait: wait}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the lock of %s: %w", dest, ctx.Err())
		case <-stop:
			return nil, fmt.Errorf("confd is stopping: gave up waiting for the lock of %s", dest)
		case <-time.After(lockPoll):
		}
	}
}

// tryLock returns the open lock file, or nil, nil when another process
// holds the lock. Closing the file releases the lock; the file stays for
// the next pass.
func tryLock(p string) (*os.File, error) {
	for {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("lock file: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			_ = f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, nil
			}
			return nil, fmt.Errorf("lock %s: %w", p, err)
		}
		// Someone may have removed the file between our open and our
		// flock: a lock on that file locks nothing any more.
		held, err := f.Stat()
		now, serr := os.Stat(p)
		if err == nil && serr == nil && os.SameFile(held, now) {
			// Fixed width, in place: no truncate, no block freed or
			// allocated once the file exists.
			_, _ = fmt.Fprintf(f, "%10d\n", os.Getpid())
			return f, nil
		}
		_ = f.Close()
		if err == nil && !errors.Is(serr, fs.ErrNotExist) {
			err = serr
		}
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", p, err)
		}
	}
}

// holder is the PID a lock file names, or 0.
func holder(p string) int {
	b, _ := os.ReadFile(p) // unreadable: "", which is 0
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}
