package custodian

import (
	"path"
	"strings"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
)

// relPath maps an ACP path (absolute, in the computer's namespace) to the
// path relative to the tuple's root that the receiver takes. It is a pure
// string check that never touches the host: anything that is not root
// itself or strictly beneath it, or that names "..", is refused with
// path_escape before anything is sent (the receiver resolves it again with
// openat2 beneath the root; this only keeps obvious escapes off the wire).
// A path that ends in "/" (or "/.") names a directory, and keeps its final
// slash: cleaning it away would make "dir/name/" a file name the receiver
// writes a regular file to; kept, a write refuses it (no file name) and
// a read finds no directory.
func relPath(root, p string) (string, error) {
	switch {
	case p == "":
		return "", acperr.NewError(errcode.CodeInvalid, "path is empty")
	case strings.IndexByte(p, 0) >= 0:
		return "", acperr.NewError(errcode.CodeInvalid, "path contains NUL")
	case !path.IsAbs(p):
		return "", acperr.NewError(errcode.CodeInvalid, "path %q is not absolute", p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", acperr.NewError(errcode.CodePathEscape, "path %q contains ..", p)
		}
	}
	clean := path.Clean(p)
	if clean == root {
		return ".", nil
	}
	prefix := root + "/"
	if root == "/" {
		prefix = "/"
	}
	if !strings.HasPrefix(clean, prefix) {
		return "", acperr.NewError(errcode.CodePathEscape, "path %q is outside the root %q", p, root)
	}
	rel := strings.TrimPrefix(clean, prefix)
	if strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.") {
		rel += "/"
	}
	return rel, nil
}
