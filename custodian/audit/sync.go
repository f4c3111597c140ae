package audit

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/tetherdev/tether/admission/atomicfile"
)

// Sync waits until every record appended before the call is durable.
func (l *Log) Sync(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		l.mu.Lock()
		l.cond.Broadcast()
		l.mu.Unlock()
	})
	defer stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	target := l.next
	for l.durable < target {
		if l.broken != nil {
			return l.broken
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		l.cond.Wait()
	}
	return nil
}

// Checkpoint makes everything appended so far durable, then signs and
// writes a checkpoint covering it, and returns the signed note.
func (l *Log) Checkpoint(ctx context.Context) ([]byte, error) {
	if err := l.Sync(ctx); err != nil {
		return nil, err
	}
	return l.checkpointDurable()
}

func (l *Log) dueCheckpoint() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	due := l.tickDue && l.broken == nil && l.durable > l.lastCkpt
	l.tickDue = false
	return due
}

// checkpointDurable signs the durable prefix and replaces the checkpoint
// file atomically (temp file, fsync, rename, directory fsync).
func (l *Log) checkpointDurable() ([]byte, error) {
	l.ckMu.Lock()
	defer l.ckMu.Unlock()
	l.mu.Lock()
	n := l.durable
	root, err := l.tree.root(n)
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	msg, err := SignCheckpoint(Checkpoint{Origin: l.opts.Signer.Name(), Size: n, Hash: root}, l.opts.Signer)
	if err == nil {
		err = writeFileAtomic(l.dir, CheckpointFile, msg)
	}
	l.mu.Lock()
	if err != nil {
		l.breakLocked(fmt.Errorf("checkpoint: %w", err))
		defer l.mu.Unlock()
		return nil, l.broken
	}
	if n > l.lastCkpt {
		l.lastCkpt = n
	}
	l.mu.Unlock()
	if l.opts.OnCheckpoint != nil {
		l.opts.OnCheckpoint(n)
	}
	return msg, nil
}

// writeFileAtomic replaces dir/name with data so a crash leaves either the
// old or the new file, never a mix.
func writeFileAtomic(dir, name string, data []byte) error {
	return atomicfile.Write(filepath.Join(dir, name), data, 0o600, atomicfile.Options{Temp: "." + name + ".tmp-*"})
}

// Close drains the queue, writes the final checkpoint and closes the
// file. Close is safe to call twice; it reports a broken log.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		<-l.done
		return nil
	}
	l.closing = true
	l.cond.Broadcast()
	l.mu.Unlock()
	<-l.done
	close(l.stop)
	l.mu.Lock()
	broken := l.broken
	l.mu.Unlock()
	var ckErr error
	if broken == nil {
		_, ckErr = l.checkpointDurable()
	}
	return errors.Join(broken, ckErr, l.f.Close())
}
