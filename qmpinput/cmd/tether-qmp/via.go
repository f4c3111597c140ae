package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/tetherdev/tether/qmpinput"
)

// runVia sends a script to a live view's agent socket and copies the
// result lines to stdout; it exits 1 if any line is not ok (or none came).
func runVia(ctx context.Context, via, socket string, script io.Reader, stdout, stderr io.Writer) int {
	if socket != "" {
		fmt.Fprintln(stderr, "run: give --via or --socket, not both")
		return exitUsage
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", via)
	if err != nil {
		return fail(stdout, exitFailed, fmt.Errorf("%w: agent socket: %w", qmpinput.ErrClosed, err))
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := io.Copy(c, io.LimitReader(script, 64<<10+1)); err != nil {
		return fail(stdout, exitFailed, err)
	}
	c.(*net.UnixConn).CloseWrite()
	return copyResults(c, stdout)
}

func copyResults(r io.Reader, stdout io.Writer) int {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	lines, bad := 0, 0
	for sc.Scan() {
		var res struct {
			OK bool `json:"ok"`
		}
		if json.Unmarshal(sc.Bytes(), &res) != nil || !res.OK {
			bad++
		}
		lines++
		if _, err := fmt.Fprintf(stdout, "%s\n", sc.Bytes()); err != nil {
			return exitFailed
		}
	}
	if sc.Err() != nil && !errors.Is(sc.Err(), net.ErrClosed) {
		bad++
	}
	if lines == 0 || bad > 0 {
		return exitFailed
	}
	return exitOK
}
