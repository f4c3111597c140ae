package main

import (
	"bufio"
	"io"
	"strings"
	"testing"
)

// TestPauseAtBlocksOnlyItsStep: the test hook lets every other step
// pass, and at its own step says so and does not return (the goroutine
// stays blocked until the test binary exits, as the daemon's would until
// SIGKILL).
func TestPauseAtBlocksOnlyItsStep(t *testing.T) {
	r, w := io.Pipe()
	hook := pauseAt("end.withdrawn", w)
	hook("create.recorded")
	hook("end.recorded")
	returned := make(chan struct{})
	go func() {
		hook("end.withdrawn")
		close(returned)
	}()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || !strings.Contains(line, "test pause at end.withdrawn") {
		t.Fatalf("the hook said %q, %v", line, err)
	}
	select {
	case <-returned:
		t.Fatal("the hook returned at its own step")
	default:
	}
}
