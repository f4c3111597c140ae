package qmpinput

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// MaxFrameBytes bounds one screendump file.
const MaxFrameBytes = 64 << 20

// Frame is one guest screenshot.
type Frame struct {
	PNG     []byte    `json:"-"`
	Width   int       `json:"width"`
	Height  int       `json:"height"`
	Time    time.Time `json:"time"`
	SHA256  string    `json:"sha256"`
	Deduped bool      `json:"deduped"` // identical to a retained capture
}

// screendumpArgs are the arguments of QMP screendump (QEMU >= 7.1 for
// format). go-qemu's generated Screendump predates device, head and format.
type screendumpArgs struct {
	Filename string `json:"filename"`
	Device   string `json:"device"`
	Head     int    `json:"head"`
	Format   string `json:"format"`
}

// makeCaptureDir creates the private capture directory (mode 0700) under
// parent and hands it to the QEMU uid when that is not the adapter's own.
func makeCaptureDir(parent string, qemuUID uint32) (string, error) {
	dir, err := os.MkdirTemp(parent, "tether-qmp-")
	if err != nil {
		return "", fmt.Errorf("%w: capture dir: %w", ErrConfig, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	if qemuUID != uint32(os.Geteuid()) {
		if err := os.Chown(dir, int(qemuUID), -1); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("%w: capture dir %s cannot be handed to QEMU's uid %d: %w", ErrConfig, dir, qemuUID, err)
		}
	}
	return dir, nil
}

// screendump asks QEMU to write the pinned display as PNG to a fresh file
// in the private directory, then reads and checks it.
func (a *Adapter) screendump(ctx context.Context) (Frame, string, error) {
	name := filepath.Join(a.dir, fmt.Sprintf("capture-%d.png", a.seq.Add(1)))
	args, _ := json.Marshal(screendumpArgs{Filename: name, Device: a.cfg.Display.Device, Head: a.cfg.Display.Head, Format: "png"})
	cmd, _ := json.Marshal(map[string]json.RawMessage{"execute": json.RawMessage(`"` + cmdScreendump + `"`), "arguments": args})
	if _, err := a.conn.run(ctx, cmd); err != nil {
		os.Remove(name)
		return Frame{}, "", err
	}
	data, err := a.readCapture(name)
	if err != nil {
		os.Remove(name)
		return Frame{}, "", err
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		os.Remove(name)
		return Frame{}, "", fmt.Errorf("%w: %s is not a PNG: %w", ErrCapture, name, err)
	}
	sum := sha256.Sum256(data)
	return Frame{PNG: data, Width: cfg.Width, Height: cfg.Height, Time: a.now(), SHA256: hex.EncodeToString(sum[:])}, name, nil
}

// readCapture opens the file QEMU wrote without following symlinks and
// checks it is a regular file owned by QEMU's uid and bounded in size. Its
// mode is not checked: it follows QEMU's umask, and the private 0700
// directory it sits in already keeps every other uid out.
func (a *Adapter) readCapture(name string) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %w", ErrCapture, name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCapture, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrCapture, name)
	case !ok || st.Uid != a.owner:
		return nil, fmt.Errorf("%w: %s is not owned by QEMU's uid %d", ErrCapture, name, a.owner)
	case fi.Size() > MaxFrameBytes:
		return nil, fmt.Errorf("%w: %s is %d bytes, limit %d", ErrCapture, name, fi.Size(), MaxFrameBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFrameBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrCapture, name, err)
	}
	if len(data) > MaxFrameBytes {
		return nil, fmt.Errorf("%w: %s grew past %d bytes", ErrCapture, name, MaxFrameBytes)
	}
	return data, nil
}

// Capture takes a screenshot of the pinned display. It is refused with
// ErrMasked while a handover is active. A frame identical to a retained one
// is deduplicated (Deduped set; the new file is removed). A capture that
// does not fit in the pool after pruning fails with ErrPoolFull. On success
// the frame's size becomes the pixel space of pointer input.
func (a *Adapter) Capture(ctx context.Context) (Frame, error) {
	if err := a.agentGate(ErrMasked); err != nil {
		return Frame{}, err
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	f, name, err := a.screendump(ctx)
	if err != nil {
		return Frame{}, err
	}
	if a.pool.lookup(f.SHA256, f.Time) {
		os.Remove(name)
		f.Deduped = true
	} else if err := a.pool.admit(f.SHA256, name, int64(len(f.PNG)), f.Time); err != nil {
		os.Remove(name)
		return Frame{}, err
	}
	// A handover that began while QEMU was writing masks this frame too.
	if err := a.agentGate(ErrMasked); err != nil {
		return Frame{}, err
	}
	a.space.Store(&pixelSpace{width: f.Width, height: f.Height, sha: f.SHA256})
	return f, nil
}

// Retained returns the PNG bytes of a capture still in the pool; it is
// masked during a handover like Capture.
func (a *Adapter) Retained(sha256Hex string) ([]byte, error) {
	if err := a.agentGate(ErrMasked); err != nil {
		return nil, err
	}
	b, ok := a.pool.read(sha256Hex)
	if !ok {
		return nil, fmt.Errorf("%w: capture %s is not retained", ErrCapture, sha256Hex)
	}
	return b, nil
}

// PoolUsage returns the bytes and captures the pool retains.
func (a *Adapter) PoolUsage() (bytes int64, captures int) { return a.pool.stats() }
