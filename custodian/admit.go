package custodian

import "context"

// admit asks custodian/binding, once, whether the callback is admitted
// (binding.Table.Admit decides every refusal and fence of it).
func (h *client) admit(ctx context.Context, method, sessionID string, meta map[string]any) (*call, error) {
	bc, err := h.conn.table.Admit(ctx, method, sessionID, meta)
	if err != nil {
		return nil, err
	}
	return &call{Call: bc, c: h.c, b: sessionOf(bc.Session)}, nil
}
