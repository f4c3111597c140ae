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
	"net"

	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wire"
)

// Dialer returns the Dialer of r's endpoint. TLS credentials are read now,
// through credfile's owner and mode checks, so a bad file fails at start.
func (r ReceiverConfig) Dialer() (Dialer, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	switch r.Transport {
	case "unix":
		u := transport.Unix{Path: r.Path, HostOnly: r.HostOnly, PeerUIDs: r.PeerUIDs}
		return StreamDialer(u.Dial, wire.ClientConfig{}), nil
	default:
		cfg, err := r.TLS.clientConfig(r.ServerName)
		if err != nil {
			return nil, err
		}
		return StreamDialer(tlsDial(r.Address, cfg), wire.ClientConfig{}), nil
	}
}

// clientConfig builds the mutual TLS 1.3 client configuration: our
// certificate, and the receiver verified against exactly one issuer (no
// system roots), whose public key must be the one that signed the
// receiver's certificate.
func (t *TLSConfig) clientConfig(serverName string) (*tls.Config, error) {
	certPEM, err := credfile.Read(t.Cert)
	if err != nil {
		return nil, err
	}
	keyPEM, err := credfile.Read(t.Key)
	if err != nil {
		return nil, err
	}
	issuerPEM, err := credfile.ReadPublic(t.Issuer)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: client certificate and key: %w", ErrConfig, err)
	}
	issuer, err := parseOneCert(issuerPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: issuer %s: %w", ErrConfig, t.Issuer, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(issuer)
	return &tls.Config{
		MinVersion: tls.VersionTLS13, MaxVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{pair}, RootCAs: roots, ServerName: serverName,
		VerifyConnection: pinIssuer(issuer),
	}, nil
}

// pinIssuer checks that the verified chain ends at the pinned issuer key
// and that the receiver's certificate was signed by it directly.
func pinIssuer(issuer *x509.Certificate) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("receiver presented no certificate")
		}
		leaf := cs.PeerCertificates[0]
		if err := leaf.CheckSignatureFrom(issuer); err != nil {
			return fmt.Errorf("receiver certificate not signed by the pinned issuer key: %w", err)
		}
		for _, chain := range cs.VerifiedChains {
			if root := chain[len(chain)-1]; bytes.Equal(root.RawSubjectPublicKeyInfo, issuer.RawSubjectPublicKeyInfo) {
				return nil
			}
		}
		return errors.New("receiver certificate does not chain to the pinned issuer")
	}
}

func parseOneCert(data []byte) (*x509.Certificate, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("more than one PEM block: exactly one issuer is pinned")
	}
	return x509.ParseCertificate(block.Bytes)
}

// tlsDial connects directly (never through a proxy from the environment)
// and completes the handshake before returning.
func tlsDial(addr string, cfg *tls.Config) func(ctx context.Context) (io.ReadWriteCloser, error) {
	return func(ctx context.Context) (io.ReadWriteCloser, error) {
		d := tls.Dialer{NetDialer: &net.Dialer{}, Config: cfg}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("dial receiver %s: %w", addr, err)
		}
		return c, nil
	}
}
