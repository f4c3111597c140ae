package vmsuite

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/tetherdev/tether/ci/guestrun"
	"github.com/tetherdev/tether/ci/receipt"
	"github.com/tetherdev/tether/fixtures/guest"
)

// Guest paths of a suite image.
const (
	InitPath = "/sbin/tether-suiteinit"
	BinDir   = "/suite/bin"
	SrcDir   = "/suite/src" // package directories (with testdata) by module-relative path
	Port     = "tether.report"
)

// ImageSpec is one suite image: the init, the plan and the files it runs.
type ImageSpec struct {
	Kernel  guest.Kernel
	Init    string // host path of the built tether-suiteinit
	Plan    guestrun.Plan
	Files   []guest.File
	Modules []string
}

// BuildImage writes the initramfs and returns it with every binary in it
// (executables, shared libraries and kernel modules) for the receipt.
func BuildImage(ctx context.Context, spec ImageSpec, out string) (*guest.Image, []receipt.Binary, error) {
	plan, err := json.MarshalIndent(spec.Plan, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	files := append([]guest.File{
		{Path: InitPath, Source: spec.Init, Mode: 0o755},
		{Path: guestrun.PlanPath, Data: plan, Mode: 0o644},
	}, spec.Files...)
	img, err := guest.Build(ctx, guest.Spec{Kernel: spec.Kernel, Modules: spec.Modules, Files: files, Init: InitPath}, out)
	if err != nil {
		return nil, nil, err
	}
	return img, imageBinaries(img), nil
}

// imageBinaries picks the code among the image's regular files.
func imageBinaries(img *guest.Image) []receipt.Binary {
	var out []receipt.Binary
	for _, e := range img.Entries {
		base := path.Base(e.Path)
		if e.Mode&0o111 != 0 || strings.HasSuffix(base, ".ko") || strings.Contains(base, ".so") {
			out = append(out, receipt.Binary{Path: e.Path, Size: e.Size, SHA256: e.SHA256})
		}
	}
	return out
}

// TestdataFiles returns the files under the testdata directory of the
// package at host directory dir, placed under guestDir/testdata (fuzz
// seed corpora run as tests read them from there).
func TestdataFiles(dir, guestDir string) ([]guest.File, error) {
	root := filepath.Join(dir, "testdata")
	var files []guest.File
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			if os.IsNotExist(err) && p == root {
				return fs.SkipAll
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files = append(files, guest.File{Path: path.Join(guestDir, filepath.ToSlash(rel)), Source: p, Mode: info.Mode().Perm()})
		return nil
	})
	return files, err
}
