// Package onedecoder checks the one-decoder rule (docs/decisions.md, "One
// strict JSON decoder"): every document tether defines is parsed by
// admission/strictjson. It scans the product's rooms (admission,
// custodian, receiver, plugin, qmpinput, computer, egress; not tests, fixtures
// or ci) for calls of encoding/json's Unmarshal and NewDecoder. A call is
// allowed only if it is listed below with the reason it does not parse a
// tether document; a new call fails the test until it uses strictjson or is
// listed, and a listed call that is gone fails it too, so the list never
// keeps a stale exemption.
package onedecoder

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// allowed maps "file:function" to why that call is not a tether
// document's parser.
var allowed = map[string]string{
	"admission/acperr/acperr.go:remarshalLoose":        "reads the data of an ACP error another party built (the SDK's shape, not ours), loosely on purpose",
	"admission/coordinator/baotest/baotest.go:check":   "the fake OpenBao server's check of a request body the coordinator sent (a test double, not a parser the product runs)",
	"custodian/longline/bigline.go:decodeLong":         "the JSON-RPC envelope of an agent message over the SDK's 10 MiB, as acp-go-sdk would read it; the params are then decoded as the ACP request type",
	"custodian/longline/content.go:decodeRawLong":      "the same long fs/write_text_file line as decodeLong, as acp-go-sdk would read it, with the content left raw in the line; anything encoding/json reports sends the line to decodeLong",
	"custodian/longline/locate.go:decodeLocated":       "the same long fs/write_text_file line as decodeRawLong with its content string cut to \"\" (the content's syntax checked by its unquote pass); anything encoding/json reports sends the line to the whole decode",
	"custodian/longline/reads.go:decodeRead":           "an agent message's JSON-RPC envelope, decoded into acp-go-sdk's own envelope type as its receive does, to serve fs/read_text_file beside it",
	"custodian/longline/reads.go:runRead":              "the params of an fs/read_text_file request, decoded into the ACP request type as acp-go-sdk's handler does",
	"custodian/longline/idscan.go:endKey":              "one JSON string, a key of an agent message's envelope with an escape in it, to find the id and method of a long line without holding it",
	"custodian/longline/idscan.go:endValue":            "one JSON string, the method name of a long agent message, to answer its refusal; the message itself is never decoded from it",
	"custodian/agentprofile/profile.go:packageVersion": "the version field of an agent's npm package.json, only to warn about an untested version; nothing is decided on it",
	"custodian/config.go:UnmarshalJSON":                "one JSON string inside a config the strict decoder is already decoding (Duration)",
	"custodian/dispatch.go:decodeResponse":             "a stored ACP response the custodian encoded itself and the receipt store decoded strictly",
	"custodian/opstore/etcd_claim.go:createOwner":      "only the name of another custodian, for an error message; the claim itself is decided by etcd's revisions",
	"plugin/acptest/client.go:HandleExtensionMethod":   "the plugin tests' ACP client (a test double, not a parser the product runs)",
	"plugin/contract/errors.go:jsonRPCErrorFromPB":     "the data of an ACP error, shown to the caller as it came",
	"qmpinput/keys.go:qcode":                           "a quoted key name already checked against the allowlist, to reuse the QKeyCode table's own JSON names",
	"qmpinput/transport.go:deliverEvent":               "a QMP event from QEMU (QEMU's protocol, not ours); an event that does not decode is dropped",
	"computer/vm/qmp.go:qmpReply":                      "a QMP reply from QEMU (QEMU's protocol, not ours), read for stop, cont and query-status",
	"computer/vm/machine.go:Running":                   "QMP query-status's return from QEMU (QEMU's protocol, not ours)",
	"computer/vm/savedstate.go:saveTo":                 "QMP query-migrate's return from QEMU (QEMU's protocol, not ours), polled while the template guest is saved",
	"computer/vm/savedstate.go:resume":                 "QMP query-status's return from QEMU (QEMU's protocol, not ours), polled while a saved state loads",
	"qmpinput/cmd/tether-qmp/view.go:readViewOrigin":   "the view's own status line, to print its origin; nothing is decided on it",
	"qmpinput/cmd/tether-qmp/via.go:copyResults":       "counts result lines the view's agent socket wrote, to report failures",
}

var rooms = []string{"admission", "custodian", "receiver", "plugin", "qmpinput", "computer", "egress"}

func TestEveryParserUsesStrictJSON(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, room := range rooms {
		err := filepath.WalkDir(filepath.Join(root, room), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			rel, _ := filepath.Rel(root, path)
			if strings.HasPrefix(filepath.ToSlash(rel), "admission/strictjson/") {
				return nil
			}
			for _, site := range decodeCalls(t, path) {
				found[filepath.ToSlash(rel)+":"+site] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var unlisted, stale []string
	for k := range found {
		if _, ok := allowed[k]; !ok {
			unlisted = append(unlisted, k)
		}
	}
	for k := range allowed {
		if !found[k] {
			stale = append(stale, k)
		}
	}
	sort.Strings(unlisted)
	sort.Strings(stale)
	for _, k := range unlisted {
		t.Errorf("%s decodes JSON with encoding/json: use admission/strictjson, or list it here with the reason it parses no tether document", k)
	}
	for _, k := range stale {
		t.Errorf("%s is listed but no longer decodes with encoding/json: remove it from the list", k)
	}
}

// decodeCalls returns the enclosing function of each call of
// encoding/json's Unmarshal or NewDecoder in the file at path.
func decodeCalls(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	name := jsonImportName(f)
	if name == "" {
		return nil
	}
	var sites []string
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Unmarshal" || sel.Sel.Name == "NewDecoder") {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == name {
					sites = append(sites, fn.Name.Name)
				}
			}
			return true
		})
	}
	return sites
}

// jsonImportName is the name encoding/json is imported under, or "".
func jsonImportName(f *ast.File) string {
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "encoding/json" {
			if imp.Name != nil {
				return imp.Name.Name
			}
			return "json"
		}
	}
	return ""
}
