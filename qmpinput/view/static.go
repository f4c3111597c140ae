package view

import (
	"embed"
	"errors"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
)

// web holds the page (index.html, app.js, app.css) and the vendored
// noVNC client (web/third_party/novnc, see its VENDORED.md), served at
// /novnc/.
//
//go:embed web
var web embed.FS

// static serves the embedded files by exact name: GET and HEAD only, no
// directory listings, no other path. The files carry no data about the
// VM; the Host (and an Origin, if sent) must still be this server's.
func (s *Server) static() http.Handler {
	root, _ := fs.Sub(web, "web")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			refuse(w, http.StatusMethodNotAllowed, "method", errors.New("GET only"))
			return
		}
		if err := s.checkOrigin(r, false); err != nil {
			refuse(w, http.StatusForbidden, "origin", err)
			return
		}
		b, name, err := staticFile(root, r.URL.Path)
		if err != nil || strings.HasSuffix(name, "SHA256SUMS") {
			http.NotFound(w, r)
			return
		}
		ct := mime.TypeByExtension(path.Ext(name))
		if path.Ext(name) == ".js" {
			ct = "text/javascript; charset=utf-8"
		}
		if ct == "" {
			ct = "text/plain; charset=utf-8"
		}
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Cache-Control", "no-cache")
		w.Write(b)
	})
}

// vendoredPrefix is where the vendored noVNC sits in web; it is served
// at /novnc/ and under no other name.
const vendoredPrefix = "third_party/"

// staticFile reads the embedded file a request path names: "/" is
// index.html, /novnc/... is the vendored client.
func staticFile(root fs.FS, urlPath string) ([]byte, string, error) {
	name := strings.TrimPrefix(path.Clean(urlPath), "/")
	switch {
	case name == "":
		name = "index.html"
	case strings.HasPrefix(name, vendoredPrefix):
		return nil, name, fs.ErrNotExist
	case strings.HasPrefix(name, "novnc/"):
		name = vendoredPrefix + name
	}
	b, err := fs.ReadFile(root, name)
	return b, name, err
}
