package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/computer/api"
)

// Touch records activity on a computer, resuming it when suspended.
func (c *Client) Touch(ctx context.Context, id string) (api.Computer, error) {
	var out api.Computer
	return out, c.call(ctx, http.MethodPost, idPath(id, "/touch"), nil, http.StatusOK, &out)
}

// Receipts lists the receipts of the computer's exports, imports and
// copies, oldest first.
func (c *Client) Receipts(ctx context.Context, id string) ([]api.Receipt, error) {
	var out api.ReceiptList
	return out.Receipts, c.call(ctx, http.MethodGet, idPath(id, "/receipts"), nil, http.StatusOK, &out)
}

// Stream says what an export or a copy out sent: the digest the daemon
// announced, which the client checked against the bytes it received.
type Stream struct {
	SHA256 string
	Bytes  int64
}

// Export writes the tar.zst of a suspended computer's root to w, and
// fails when the bytes written are not those whose SHA-256 the daemon
// announced. The caller keeps w.
func (c *Client) Export(ctx context.Context, id string, w io.Writer) (Stream, error) {
	return c.download(ctx, idPath(id, "/export"), w)
}

// CopyOut writes the tar stream of path in the computer (its one top
// entry named path's last element) to w, checked as Export's.
func (c *Client) CopyOut(ctx context.Context, id, path string, w io.Writer) (Stream, error) {
	return c.download(ctx, idPath(id, "/files")+"?"+url.Values{"path": {path}}.Encode(), w)
}

// CopyIn sends the tar stream r to be extracted beneath the folder dir
// of the computer's root, and returns the daemon's receipt.
func (c *Client) CopyIn(ctx context.Context, id, dir string, r io.Reader) (api.Receipt, error) {
	var out api.Receipt
	path := idPath(id, "/files") + "?" + url.Values{"path": {dir}}.Encode()
	return out, c.upload(ctx, http.MethodPut, path, "application/x-tar", r, http.StatusOK, &out)
}

// Import sends the tar.zst stream r, whose SHA-256 is sha256, and
// returns the computer the daemon made of it with the import's receipt.
// The create fields of req that are not zero go along.
func (c *Client) Import(ctx context.Context, r io.Reader, sha256 string, req api.CreateRequest) (api.ImportResult, error) {
	q := url.Values{"sha256": {sha256}}
	if req.Tier != "" {
		q.Set("tier", req.Tier)
	}
	for k, v := range map[string]int64{"lease_ttl_s": req.LeaseTTLSeconds, "idle_timeout_s": req.IdleTimeoutSeconds,
		"queue_timeout_s": req.QueueTimeoutSeconds, "memory_bytes": req.Limits.MemoryBytes, "pids": req.Limits.Pids,
		"disk_bytes": req.Limits.DiskBytes} {
		if v != 0 {
			q.Set(k, strconv.FormatInt(v, 10))
		}
	}
	var out api.ImportResult
	return out, c.upload(ctx, http.MethodPost, "/v1/computers/import?"+q.Encode(), "application/zstd", r, http.StatusCreated, &out)
}

// upload sends body as ctype and decodes the answer strictly into out.
func (c *Client) upload(ctx context.Context, method, path, ctype string, body io.Reader, want int, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", ctype)
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		return answerError(resp)
	}
	if err := strictjson.Read(resp.Body, maxAnswer, out); err != nil {
		return fmt.Errorf("client: %s %s: answer: %w", method, path, err)
	}
	return nil
}

// download copies a streamed answer to w and checks its digest and
// length against the headers.
func (c *Client) download(ctx context.Context, path string, w io.Writer) (Stream, error) {
	resp, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return Stream{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Stream{}, answerError(resp)
	}
	want := resp.Header.Get(api.HeaderSHA256)
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), resp.Body)
	if err != nil {
		return Stream{}, fmt.Errorf("client: GET %s: %w", path, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if got != want || (resp.ContentLength >= 0 && n != resp.ContentLength) {
		return Stream{}, fmt.Errorf("client: GET %s: received %d bytes with SHA-256 %s, the daemon announced %d bytes with %q",
			path, n, got, resp.ContentLength, want)
	}
	return Stream{SHA256: got, Bytes: n}, nil
}
