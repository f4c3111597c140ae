package contract

import (
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	pb "github.com/tetherdev/tether/plugin/proto"
)

// attachingPlugin stands in for the plugin's side of OpenSession: it asks
// for the attach calls it is given, in order, then answers with a status.
type attachingPlugin struct {
	pb.UnimplementedPluginServer
	calls []*pb.AttachCall
}

func (s *attachingPlugin) OpenSession(stream pb.Plugin_OpenSessionServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	for _, c := range s.calls {
		if err := stream.Send(&pb.OpenSessionDown{Msg: &pb.OpenSessionDown_Attach{Attach: c}}); err != nil {
			return err
		}
		if _, err := stream.Recv(); err != nil {
			return err
		}
	}
	return stream.Send(&pb.OpenSessionDown{Msg: &pb.OpenSessionDown_Status{Status: &pb.SessionStatus{
		SessionId: "s1", State: pb.BindingState_BINDING_STATE_BOUND}}})
}

// clientFor serves srv on an in-memory gRPC connection and returns the
// host's adapter to it.
func clientFor(t *testing.T, srv pb.PluginServer) *PluginClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	pb.RegisterPluginServer(s, srv)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///plugin", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close(); s.Stop(); wg.Wait() })
	return &PluginClient{client: pb.NewPluginClient(cc)}
}

// TestOpenSessionAttachesOnlyTheSessionBeingOpened attacks the host's
// side of OpenSession: the plugin may have it send `_tether/attach` once,
// for the session being opened, and nothing else; an attach for another
// session, or a second one, is refused and not sent.
func TestOpenSessionAttachesOnlyTheSessionBeingOpened(t *testing.T) {
	ok := &pb.AttachCall{SessionId: "s1", TupleSha256: "abc"}
	for name, c := range map[string]struct {
		calls []*pb.AttachCall
		sent  int
		code  errcode.Code
	}{
		"one_for_the_session": {[]*pb.AttachCall{ok}, 1, ""},
		"another_session":     {[]*pb.AttachCall{{SessionId: "s2", TupleSha256: "abc"}}, 0, errcode.CodeInternal},
		"twice":               {[]*pb.AttachCall{ok, ok}, 1, errcode.CodeInternal},
	} {
		client := clientFor(t, &attachingPlugin{calls: c.calls})
		var sent []string
		attach := func(_ context.Context, sid, sha string) (json.RawMessage, error) {
			sent = append(sent, sid+"/"+sha)
			return json.RawMessage(`{}`), nil
		}
		st, err := client.OpenSession(context.Background(), OpenRequest{ConnID: "c", SessionID: "s1", Method: MethodNew}, attach)
		code, _ := acperr.CodeOf(err)
		if len(sent) != c.sent || code != c.code || (err == nil && st.State != Bound) {
			t.Errorf("%s: sent %v, status %+v, error %v", name, sent, st, err)
		}
		for _, s := range sent {
			if s != "s1/abc" {
				t.Errorf("%s: sent an attach for %s", name, s)
			}
		}
	}
}
