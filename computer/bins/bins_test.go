package bins

import (
	"errors"
	"os"
	"testing"
)

func TestRequireRefusesMissingAndNonExecutable(t *testing.T) {
	d := t.TempDir()
	s := Set{Dir: d}
	if err := s.Require(Receiver); !errors.Is(err, ErrMissing) {
		t.Fatalf("missing binary: %v", err)
	}
	if err := os.WriteFile(s.Path(Receiver), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Require(Receiver); !errors.Is(err, ErrMissing) {
		t.Fatalf("non-executable binary: %v", err)
	}
	if err := os.Mkdir(s.Path(Plugin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Require(Plugin); !errors.Is(err, ErrMissing) {
		t.Fatalf("directory named like a binary: %v", err)
	}
	if err := os.Chmod(s.Path(Receiver), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Require(Receiver); err != nil {
		t.Fatalf("executable binary: %v", err)
	}
}
