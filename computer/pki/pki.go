// Package pki mints the certificates of one computer (computer/provision)
// and of tether's tests: one issuing CA per computer, server and client
// leaf certificates signed directly by it, and their PEM files. Keys are
// ECDSA P-256, held in memory; the CA's key is never written to disk. It
// is not a general PKI: a CA lives as long as the computer it pins.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// DefaultValidity is how long minted certificates are valid when the
// Template leaves NotAfter zero.
const DefaultValidity = 24 * time.Hour

// CA is an issuing certificate authority held in memory.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Leaf is a certificate with its private key.
type Leaf struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// Chain is the leaf followed by any intermediates, as DER.
	Chain [][]byte
}

// Template says what to mint. Zero values mean: valid from a minute ago
// for DefaultValidity, no names.
type Template struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	NotBefore  time.Time
	NotAfter   time.Time
	// Usage is the extended key usage; Server and Client set it for you.
	Usage []x509.ExtKeyUsage
}

// NewCA mints a self-signed CA named name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	tmpl, err := baseTemplate(Template{CommonName: name})
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Server mints a server certificate (ExtKeyUsageServerAuth) for names:
// each is an IP address or a DNS name.
func (ca *CA) Server(names ...string) (*Leaf, error) {
	t := Template{Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			t.IPs = append(t.IPs, ip)
		} else {
			t.DNSNames = append(t.DNSNames, n)
		}
	}
	if len(names) > 0 {
		t.CommonName = names[0]
	}
	return ca.Issue(t)
}

// Client mints a client certificate (ExtKeyUsageClientAuth) named name.
func (ca *CA) Client(name string) (*Leaf, error) {
	return ca.Issue(Template{CommonName: name, Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

// Issue mints a leaf from t, signed by ca.
func (ca *CA) Issue(t Template) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: leaf key: %w", err)
	}
	tmpl, err := baseTemplate(t)
	if err != nil {
		return nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = t.Usage
	tmpl.DNSNames = t.DNSNames
	tmpl.IPAddresses = t.IPs
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign leaf: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Leaf{Cert: cert, Key: key, Chain: [][]byte{der}}, nil
}

// Intermediate mints a CA certificate signed by ca (for tests that check a
// chain through an intermediate is refused by a pin on ca).
func (ca *CA) Intermediate(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl, err := baseTemplate(Template{CommonName: name})
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign intermediate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

func baseTemplate(t Template) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	nb, na := t.NotBefore, t.NotAfter
	if nb.IsZero() {
		nb = time.Now().Add(-time.Minute)
	}
	if na.IsZero() {
		na = nb.Add(DefaultValidity)
	}
	if !na.After(nb) {
		return nil, errors.New("pki: NotAfter is not after NotBefore")
	}
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: t.CommonName},
		NotBefore:    nb,
		NotAfter:     na,
	}, nil
}

// TLSCertificate returns the leaf as a tls.Certificate.
func (l *Leaf) TLSCertificate() tls.Certificate {
	return tls.Certificate{Certificate: l.Chain, PrivateKey: l.Key, Leaf: l.Cert}
}

// WithIntermediate returns a copy of l whose chain also carries inter's
// certificate, as a peer would present a chain through an intermediate.
func (l *Leaf) WithIntermediate(inter *CA) *Leaf {
	c := *l
	c.Chain = append(append([][]byte(nil), l.Chain...), inter.Cert.Raw)
	return &c
}

// CertPEM returns the certificate chain as PEM.
func (l *Leaf) CertPEM() []byte {
	var out []byte
	for _, der := range l.Chain {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	return out
}

// KeyPEM returns the private key as PKCS#8 PEM.
func (l *Leaf) KeyPEM() ([]byte, error) { return keyPEM(l.Key) }

// CertPEM returns the CA certificate as PEM.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// SPKISHA256 returns the lowercase hex SHA-256 of the CA's
// SubjectPublicKeyInfo: the issuer pin.
func (ca *CA) SPKISHA256() string {
	sum := sha256.Sum256(ca.Cert.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

func keyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("pki: marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// WriteCert writes the CA certificate to path (mode 0644).
func (ca *CA) WriteCert(path string) error {
	return writeFile(path, ca.CertPEM(), 0o644)
}

// WriteFiles writes the leaf as base.crt (0644) and base.key (0600) in
// dir and returns both paths. The key file's mode is set explicitly, never
// left to the umask.
func (l *Leaf) WriteFiles(dir, base string) (certPath, keyPath string, err error) {
	kp, err := l.KeyPEM()
	if err != nil {
		return "", "", err
	}
	certPath = filepath.Join(dir, base+".crt")
	keyPath = filepath.Join(dir, base+".key")
	if err := writeFile(certPath, l.CertPEM(), 0o644); err != nil {
		return "", "", err
	}
	if err := writeFile(keyPath, kp, 0o600); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

// writeFile creates path exclusively with mode and writes data; an existing
// file is refused rather than overwritten.
func writeFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("pki: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("pki: %w", err)
	}
	return f.Close()
}
