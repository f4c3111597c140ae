package custodian

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"

	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// ReceiverDialer returns the Dialer of the endpoint r. For tls the
// credential files are read now, through credfile's owner and mode checks
// (the certificate and key must grant group and others nothing; the CA
// file may be world-readable but not writable by others), so a bad file
// fails at start. Dialing is receiver/transport's: TLS 1.3 only, the
// receiver's certificate signed directly by the pinned CA, no system
// roots, a direct TCP connection (never a proxy from the environment).
func ReceiverDialer(r ReceiverConfig) (Dialer, error) {
	dial, err := ReceiverStreamDialer(r)
	if err != nil {
		return nil, err
	}
	return StreamDialer(dial, wireclient.ClientConfig{}), nil
}

// ReceiverStreamDialer is ReceiverDialer one layer down: it checks r and
// its credential files the same way and returns the function that opens
// one byte stream to the receiver, for a caller that wraps the stream
// before StreamDialer speaks the wire protocol over it (a test harness
// observing what was sent). The caller owns and closes each stream.
func ReceiverStreamDialer(r ReceiverConfig) (func(ctx context.Context) (io.ReadWriteCloser, error), error) {
	if err := validateReceiver(r); err != nil {
		return nil, err
	}
	if r.Kind != transport.KindTLS {
		t, err := r.Transport(nil)
		if err != nil {
			return nil, fmt.Errorf("%w: receiver: %w", ErrConfig, err)
		}
		return t.Dial, nil
	}
	t, err := loadTLS(r)
	if err != nil {
		return nil, err
	}
	return t.Dial, nil
}

// loadTLS builds the TLS transport from checked credential files.
func loadTLS(r ReceiverConfig) (transport.TLS, error) {
	certPEM, err := credfile.Read(r.CertFile)
	if err != nil {
		return transport.TLS{}, err
	}
	keyPEM, err := credfile.Read(r.KeyFile)
	if err != nil {
		return transport.TLS{}, err
	}
	caPEM, err := credfile.ReadPublic(r.CAFile)
	if err != nil {
		return transport.TLS{}, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return transport.TLS{}, fmt.Errorf("%w: client certificate and key: %w", ErrConfig, err)
	}
	ca, err := parseOneCert(caPEM)
	if err != nil {
		return transport.TLS{}, fmt.Errorf("%w: ca_file %s: %w", ErrConfig, r.CAFile, err)
	}
	if !ca.IsCA || !ca.BasicConstraintsValid {
		return transport.TLS{}, fmt.Errorf("%w: ca_file %s is not a CA certificate", ErrConfig, r.CAFile)
	}
	return transport.TLS{Address: r.Address, Path: r.Path, PeerUIDs: r.PeerUIDs, CA: ca, CASPKISHA256: r.CASPKISHA256,
		Certificate: pair, ServerName: r.ServerName}, nil
}

func parseOneCert(data []byte) (*x509.Certificate, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("more than one PEM block: exactly one CA is pinned")
	}
	return x509.ParseCertificate(block.Bytes)
}
