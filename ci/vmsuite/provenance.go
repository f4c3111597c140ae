package vmsuite

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/tetherdev/tether/ci/receipt"
)

// SourceTree returns the git tree hash of the working tree at dir as it is
// now (tracked and untracked files, ignored ones excepted), and HEAD's
// commit. It stages into a temporary index and a temporary object
// directory, so the repository's index and object store are untouched.
func SourceTree(ctx context.Context, dir string) (receipt.Source, error) {
	tmp, err := os.MkdirTemp("", "tether-tree-")
	if err != nil {
		return receipt.Source{}, err
	}
	defer os.RemoveAll(tmp)
	objects, err := gitOut(ctx, dir, nil, "rev-parse", "--path-format=absolute", "--git-path", "objects")
	if err != nil {
		return receipt.Source{}, err
	}
	if err := os.Mkdir(filepath.Join(tmp, "objects"), 0o700); err != nil {
		return receipt.Source{}, err
	}
	env := []string{"GIT_INDEX_FILE=" + filepath.Join(tmp, "index"),
		"GIT_OBJECT_DIRECTORY=" + filepath.Join(tmp, "objects"),
		"GIT_ALTERNATE_OBJECT_DIRECTORIES=" + objects}
	var s receipt.Source
	steps := []struct {
		out  *string
		args []string
	}{
		{&s.GitHead, []string{"rev-parse", "HEAD"}},
		{nil, []string{"read-tree", "HEAD"}},
		{nil, []string{"add", "--all", "--", "."}},
		{&s.GitTree, []string{"write-tree"}},
	}
	for _, st := range steps {
		out, err := gitOut(ctx, dir, env, st.args...)
		if err != nil {
			return receipt.Source{}, err
		}
		if st.out != nil {
			*st.out = out
		}
	}
	headTree, err := gitOut(ctx, dir, nil, "rev-parse", "HEAD^{tree}")
	if err != nil {
		return receipt.Source{}, err
	}
	s.Dirty = headTree != s.GitTree
	return s, nil
}

func gitOut(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("source: git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// GoVersion returns the version of the go command that builds the binaries.
func GoVersion(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOVERSION: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// QEMUVersion returns what `qemu --version` says after "version ", e.g.
// "7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b2)".
func QEMUVersion(ctx context.Context, qemu string) (string, error) {
	out, err := exec.CommandContext(ctx, qemu, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", qemu, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if _, v, ok := strings.Cut(first, "version "); ok {
		return strings.TrimSpace(v), nil
	}
	return "", fmt.Errorf("%s --version: unexpected output %q", qemu, first)
}

// FileSHA256 returns the hex SHA-256 and size of the file at p.
func FileSHA256(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
