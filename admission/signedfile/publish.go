package signedfile

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/atomicfile"
	"github.com/tetherdev/tether/admission/backoff"
	"github.com/tetherdev/tether/admission/signing"
)

// Names the publisher uses inside the admission directory besides FileName.
const (
	lockName   = ".admission.lock"
	tempPrefix = ".admission.dsse.json.tmp-"
)

// Errors Publish returns; callers branch on them with errors.Is.
var (
	// ErrGenerationNotNewer: the input names a generation that is not above
	// the current file's. *GenerationError carries both.
	ErrGenerationNotNewer = errors.New("generation not newer than the current one")
	// ErrCurrentUnreadable: the current file exists but is not a snapshot
	// signed by the publisher's key, so the next generation is unknown.
	ErrCurrentUnreadable = errors.New("current admission file unreadable")
	// ErrAlreadyExpired: the input's snapshot or a grant has already ended.
	ErrAlreadyExpired = errors.New("input already expired")
	// ErrPublishDir: the admission directory cannot be used safely.
	ErrPublishDir = errors.New("admission directory")
	// ErrGenerationExhausted: the generation was omitted but the current
	// one is the largest a generation can be, so there is no next one.
	ErrGenerationExhausted = errors.New("generation exhausted: the current generation is the largest, no next one")
)

// GenerationError reports a refused generation.
type GenerationError struct {
	Given, Current uint64
}

// Error names both generations.
func (e *GenerationError) Error() string {
	return fmt.Sprintf("%s: given %d, current %d", ErrGenerationNotNewer, e.Given, e.Current)
}

// Unwrap makes errors.Is(err, ErrGenerationNotNewer) true.
func (e *GenerationError) Unwrap() error { return ErrGenerationNotNewer }

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Dir is the admission directory; it must exist, be reached without
	// symlinks, and not be writable by group or others.
	Dir string
	// Key signs every snapshot.
	Key signing.PrivateKey
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Publisher writes admission files: one writer at a time under an exclusive
// flock on DIR/.admission.lock, temp file in the same directory, fsync,
// rename over FileName, fsync of the directory. Publishers in several
// processes serialize on the lock.
type Publisher struct {
	cfg PublisherConfig
}

// Published describes a file Publish wrote.
type Published struct {
	Generation uint64
	SHA256     string // hex SHA-256 of the file's bytes
	Path       string
	KeyID      string
}

// NewPublisher validates cfg and returns a Publisher.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("%w: %q is not an absolute path", ErrPublishDir, cfg.Dir)
	}
	if cfg.Key.Public().KeyID() == "" {
		return nil, errors.New("publisher: no signing key")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Dir = filepath.Clean(cfg.Dir)
	return &Publisher{cfg: cfg}, nil
}

// Publish validates in, then, holding the lock, reads the current
// generation, signs the snapshot with generation in.Generation (or current+1
// when omitted) and replaces the file atomically. A reader sees the old
// file or the new one, never a mix. ctx bounds the wait for the lock.
func (p *Publisher) Publish(ctx context.Context, in admission.PublishInput) (Published, error) {
	return p.publish(ctx, in, nil)
}

// PublishFenced publishes like Publish on behalf of an elected leader
// whose election revision is leader. Under the same lock it refuses a
// leader revision lower than the highest one any fenced publish recorded
// in the directory (ErrDeposed, nothing written), then records leader
// (temp file, fsync, rename, fsync of the directory) before the snapshot
// is replaced. A leader that lost its election to a later one can
// therefore never publish again, however late its publish arrives.
func (p *Publisher) PublishFenced(ctx context.Context, in admission.PublishInput, leader uint64) (Published, error) {
	if leader == 0 {
		return Published{}, fmt.Errorf("%w: leader revision 0", ErrDeposed)
	}
	return p.publish(ctx, in, &leader)
}

func (p *Publisher) publish(ctx context.Context, in admission.PublishInput, leader *uint64) (Published, error) {
	if err := p.checkInput(in); err != nil {
		return Published{}, err
	}
	dir, err := p.openDir()
	if err != nil {
		return Published{}, err
	}
	defer dir.Close()
	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return Published{}, err
	}
	defer unlock()
	if leader != nil {
		if err := checkLeader(dir, *leader); err != nil {
			return Published{}, err
		}
	}
	current, err := p.currentGeneration(ctx, dir)
	if err != nil {
		return Published{}, err
	}
	gen, err := nextGeneration(current, in.Generation)
	if err != nil {
		return Published{}, err
	}
	data, err := p.envelope(ctx, gen, in)
	if err != nil {
		return Published{}, err
	}
	if leader != nil {
		if err := recordLeader(dir, *leader); err != nil {
			return Published{}, err
		}
	}
	if err := replaceFile(dir, data); err != nil {
		return Published{}, err
	}
	sum := sha256.Sum256(data)
	return Published{Generation: gen, SHA256: hex.EncodeToString(sum[:]),
		Path: filepath.Join(p.cfg.Dir, admission.FileName), KeyID: p.cfg.Key.Public().KeyID()}, nil
}

// nextGeneration returns the generation to publish after current: given
// when it is above current, else current+1 when omitted. It never wraps
// around: after math.MaxUint64 no generation is newer, and a wrapped 0
// would be a file every receiver refuses.
func nextGeneration(current uint64, given *uint64) (uint64, error) {
	if given != nil {
		if *given <= current {
			return 0, &GenerationError{Given: *given, Current: current}
		}
		return *given, nil
	}
	if current == math.MaxUint64 {
		return 0, fmt.Errorf("publish: check generation failed: %w (current %d)", ErrGenerationExhausted, current)
	}
	return current + 1, nil
}

// checkInput validates in and refuses a snapshot or grant that has already
// ended: publishing it could only revoke, and silently.
func (p *Publisher) checkInput(in admission.PublishInput) error {
	if err := in.Validate(); err != nil {
		return err
	}
	now := p.cfg.Now()
	if !in.NotAfter.After(now) {
		return fmt.Errorf("%w: snapshot not_after %s is not after now (%s)", ErrAlreadyExpired, rfc3339(in.NotAfter), rfc3339(now))
	}
	for i, g := range in.Grants {
		if !g.NotAfter.After(now) {
			return fmt.Errorf("%w: grants[%d] (tuple %s) not_after %s is not after now", ErrAlreadyExpired, i, g.Tuple.SHA256(), rfc3339(g.NotAfter))
		}
	}
	return nil
}

// openDir opens the directory without symlinks and refuses one that a
// receiver would refuse anyway.
func (p *Publisher) openDir() (*os.File, error) {
	dir, err := openDir(p.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %w", ErrPublishDir, p.cfg.Dir, err)
	}
	info, err := statFile(dir)
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("%w: %w", ErrPublishDir, err)
	}
	if info.perm&0o022 != 0 {
		dir.Close()
		return nil, fmt.Errorf("%w: %s has mode %04o: writable by group or others", ErrPublishDir, p.cfg.Dir, info.perm)
	}
	return dir, nil
}

// lockDir takes the exclusive publisher lock, polling so that ctx can end
// the wait. The returned function releases it.
func lockDir(ctx context.Context, dir *os.File) (func(), error) {
	lf, err := createAt(dir, lockName, 0o600, false)
	if err != nil {
		return nil, fmt.Errorf("%w: lock file: %w", ErrPublishDir, err)
	}
	wait := backoff.New(time.Millisecond, 50*time.Millisecond)
	for {
		err := flock(lf, true)
		if err == nil {
			return func() { lf.Close() }, nil // closing the descriptor releases the lock
		}
		if !isWouldBlock(err) {
			lf.Close()
			return nil, fmt.Errorf("%w: flock: %w", ErrPublishDir, err)
		}
		if err := wait.Wait(ctx); err != nil {
			lf.Close()
			return nil, fmt.Errorf("waiting for the publisher lock: %w", err)
		}
	}
}

// currentGeneration returns the generation of the current file, 0 if there
// is none. A file that exists but does not verify under the publisher's key
// is an error: guessing would risk a generation receivers refuse as a
// rollback. Expiry does not matter here.
func (p *Publisher) currentGeneration(ctx context.Context, dir *os.File) (uint64, error) {
	f, err := openFileAt(dir, admission.FileName)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrCurrentUnreadable, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, HardMaxBytes+1))
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrCurrentUnreadable, err)
	}
	payload, err := signing.Verify(ctx, data, admission.PayloadType, p.cfg.Key.Public())
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w (after a key change, remove it and publish with an explicit generation above the last one)",
			ErrCurrentUnreadable, admission.FileName, err)
	}
	snap, err := admission.DecodeSnapshot(payload)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrCurrentUnreadable, err)
	}
	return snap.Generation, nil
}

// envelope signs the snapshot of in with generation gen. The snapshot is
// validated exactly as the loader will validate it first: the publisher
// never signs what a receiver would refuse.
func (p *Publisher) envelope(ctx context.Context, gen uint64, in admission.PublishInput) ([]byte, error) {
	snap := admission.Snapshot{Generation: gen, NotAfter: in.NotAfter.UTC(), Grants: make([]admission.Grant, len(in.Grants))}
	for i, g := range in.Grants {
		g.NotAfter = g.NotAfter.UTC()
		if g.Groups == nil {
			g.Groups = []uint32{}
		}
		snap.Grants[i] = g
	}
	if err := snap.Validate(); err != nil {
		return nil, fmt.Errorf("publish: check snapshot failed before signing: %w", err)
	}
	payload, err := json.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("publish: marshal snapshot: %w", err)
	}
	data, err := signing.Sign(ctx, admission.PayloadType, payload, p.cfg.Key)
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	if len(data) > DefaultMaxBytes {
		return nil, fmt.Errorf("publish: %w: the file would be %d bytes, receivers accept %d by default", ErrTooLarge, len(data), DefaultMaxBytes)
	}
	return data, nil
}

// replaceFile writes data to a fresh temp file in dir, fsyncs it, renames it
// over FileName and fsyncs dir. Temp files a crashed publisher left are
// removed first (the caller holds the lock, so none is in use).
func replaceFile(dir *os.File, data []byte) error {
	removeStaleTemps(dir)
	if err := writeAt(dir, tempPrefix+randomSuffix(), admission.FileName, data); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	return nil
}

// writeAt replaces target in dir with data through the temp file tmp:
// admission/atomicfile's sequence (write, fsync, rename, fsync of the
// directory) on descriptor-relative calls that follow no symlink.
func writeAt(dir *os.File, tmp, target string, data []byte) error {
	ops := atomicfile.Ops{
		Create:  func() (*os.File, error) { return createAt(dir, tmp, 0o644, true) },
		Rename:  func(name string) error { return renameAt(dir, name, target) },
		Remove:  func(name string) { _ = unlinkAt(dir, name) },
		SyncDir: func() error { return atomicfile.DirSync(dir) },
	}
	return atomicfile.Replace(ops, 0o644, atomicfile.Options{}, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

func removeStaleTemps(dir *os.File) {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return
	}
	for _, n := range names {
		if strings.HasPrefix(n, tempPrefix) || strings.HasPrefix(n, leaderName+".tmp-") {
			unlinkAt(dir, n)
		}
	}
}

func randomSuffix() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
