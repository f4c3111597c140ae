package acperr

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
)

func TestCodeOf(t *testing.T) {
	e := NewError(errcode.CodePathEscape, "path %q leaves the root", "../x")
	// Simulate the error crossing a JSON-RPC connection.
	data, _ := json.Marshal(e)
	var crossed acp.RequestError
	if err := json.Unmarshal(data, &crossed); err != nil {
		t.Fatal(err)
	}
	if c, ok := CodeOf(fmt.Errorf("wrapped: %w", &crossed)); !ok || c != errcode.CodePathEscape {
		t.Fatalf("CodeOf = %q %v, want path_escape", c, ok)
	}
	forged := &acp.RequestError{Code: acpmeta.ErrorCode, Data: map[string]any{acpmeta.DataKey: "root_shell"}}
	if c, ok := CodeOf(forged); ok {
		t.Fatalf("CodeOf accepted code %q outside the closed set", c)
	}
	if _, ok := CodeOf(errors.New("plain")); ok {
		t.Fatal("CodeOf found a code in a plain error")
	}
}
