package opstore

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReadEtcd returns every receipt stored under prefix (DefaultEtcdPrefix
// when empty) in the fleet's etcd, oldest dispatch first, exactly as the
// custodians recorded them: it holds no lease, claims nothing and writes
// nothing. A key still dispatched or pending is in flight at its owner,
// or, if its owner died, becomes interrupted when the session is next
// claimed. ctx bounds the read.
func ReadEtcd(ctx context.Context, cli *clientv3.Client, prefix string) ([]*Receipt, error) {
	if prefix == "" {
		prefix = DefaultEtcdPrefix
	}
	resp, err := cli.Get(ctx, prefix+"ops/", clientv3.WithPrefix())
	if err != nil {
		return nil, unavailable("list op keys", err)
	}
	out := make([]*Receipt, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		r, err := Unmarshal(kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	sortReceipts(out)
	return out, nil
}
