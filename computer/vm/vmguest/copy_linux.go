package vmguest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/tetherdev/tether/computer/archive"
	"github.com/tetherdev/tether/computer/vm/ctl"
)

// The guest's side of copy in and out (ctl copy.go): the host streams a
// tar in chunks that an extraction beneath the grant's root takes
// (archive.ExtractTar: every top name new, files the grant's uid and
// gid, no escape from the root, undone on failure), or takes in chunks
// the tar of a path beneath it (archive.WriteTar). Only the goroutine
// that serves the control port touches the agent's copy; the archive
// call runs in a goroutine of its own, joined through the copy's done.

// errCopyAborted ends the archive call of a copy the host ended.
var errCopyAborted = errors.New("copy aborted by the host")

// copySession is the copy in progress.
type copySession struct {
	in     bool
	pw     *io.PipeWriter // copy in: the extraction reads what is written
	pr     *io.PipeReader // copy out: the tar is read from it
	cancel context.CancelFunc
	done   chan copyResult // the archive call's end, sent once

	rcFiles int64 // the files the archive call counted, once it ended (copyEnd)
}

type copyResult struct {
	rc  archive.Receipt
	err error
}

func (a *agent) handleCopy(req ctl.Request) ctl.Response {
	switch req.Op {
	case ctl.OpCopyInBegin:
		return copyFailure(a.copyInBegin(req.Path))
	case ctl.OpCopyInData:
		return a.copyInData(req.Data)
	case ctl.OpCopyInEnd:
		return a.copyInEnd()
	case ctl.OpCopyOutBegin:
		return copyFailure(a.copyOutBegin(req.Path))
	case ctl.OpCopyOutData:
		return a.copyOutData()
	}
	a.copyAbort()
	return ctl.Response{}
}

// copyInBegin ends any copy in progress and starts extracting beneath
// dir of the grant's root what copy_in_data sends.
func (a *agent) copyInBegin(dir string) error {
	a.copyAbort()
	root, err := os.OpenRoot(a.cfg.Root)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	s := &copySession{in: true, pw: pw, cancel: cancel, done: make(chan copyResult, 1)}
	own := archive.Owner{UID: int(a.cfg.UID), GID: int(a.cfg.GID)}
	go func() {
		defer root.Close()
		rc, err := archive.ExtractTar(ctx, pr, root, dir, archive.CopyOptions{Owner: own})
		pr.CloseWithError(errors.Join(err, io.ErrClosedPipe)) // a later chunk fails at once
		s.done <- copyResult{rc, err}
	}()
	a.copy = s
	return nil
}

// copyInData hands data to the extraction and answers once it took all
// of it; when the extraction failed, its error (and the copy is over).
func (a *agent) copyInData(data []byte) ctl.Response {
	s := a.copy
	if s == nil || !s.in {
		return ctl.Response{Error: "copy_in_data: no copy in was begun"}
	}
	if _, err := s.pw.Write(data); err != nil {
		return copyFailure(a.copyEnd())
	}
	return ctl.Response{}
}

// copyInEnd ends the tar and answers when the extraction is done.
func (a *agent) copyInEnd() ctl.Response {
	s := a.copy
	if s == nil || !s.in {
		return ctl.Response{Error: "copy_in_end: no copy in was begun"}
	}
	s.pw.Close()
	if err := a.copyEnd(); err != nil {
		return copyFailure(err)
	}
	return ctl.Response{Files: s.rcFiles}
}

// copyOutBegin ends any copy in progress and starts writing the tar of
// path beneath the grant's root for copy_out_data to read.
func (a *agent) copyOutBegin(path string) error {
	a.copyAbort()
	root, err := os.OpenRoot(a.cfg.Root)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	s := &copySession{pr: pr, cancel: cancel, done: make(chan copyResult, 1)}
	go func() {
		defer root.Close()
		rc, err := archive.WriteTar(ctx, root, path, "", pw)
		pw.CloseWithError(err) // nil: the reader sees io.EOF
		s.done <- copyResult{rc, err}
	}()
	a.copy = s
	return nil
}

// copyOutData answers the next chunk of the tar, or Done with the files
// it holds once it ended (or the tar's failure).
func (a *agent) copyOutData() ctl.Response {
	s := a.copy
	if s == nil || s.in {
		return ctl.Response{Error: "copy_out_data: no copy out was begun"}
	}
	buf := make([]byte, ctl.MaxCopyChunk)
	n, err := io.ReadFull(s.pr, buf)
	if n > 0 {
		return ctl.Response{Data: buf[:n]} // a failure after these bytes comes with the next call
	}
	if err = a.copyEnd(); err != nil {
		return copyFailure(err)
	}
	return ctl.Response{Done: true, Files: s.rcFiles}
}

// copyEnd waits for the copy's archive call, forgets the copy and
// returns the call's error; a copy out's file count is kept on s.
func (a *agent) copyEnd() error {
	s := a.copy
	a.copy = nil
	res := <-s.done
	s.cancel()
	s.rcFiles = res.rc.Files
	return res.err
}

// copyAbort ends the copy in progress, if any: its archive call is
// cancelled and its pipe closed, and it returns once the call returned
// (a copy in's extraction has then undone what it made).
func (a *agent) copyAbort() {
	s := a.copy
	if s == nil {
		return
	}
	s.cancel()
	if s.in {
		s.pw.CloseWithError(errCopyAborted)
	} else {
		s.pr.CloseWithError(errCopyAborted)
	}
	_ = a.copyEnd()
}

// copyFailure is the answer to a failed copy: the error, with the
// archive check it failed (Refused) and its errno when it has them.
func copyFailure(err error) ctl.Response {
	if err == nil {
		return ctl.Response{}
	}
	r := fsFailure(err)
	switch {
	case errors.Is(err, archive.ErrUnsafeEntry):
		r.Refused = ctl.RefusedUnsafe
	case errors.Is(err, archive.ErrTooLarge):
		r.Refused = ctl.RefusedTooLarge
	case errors.Is(err, archive.ErrNotEmpty):
		r.Refused = ctl.RefusedNotNew
	}
	if r.Error == "" {
		r.Error = fmt.Sprint(err)
	}
	return r
}
