package grpcapi

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// certReloader serves the certificate in a PEM pair of files and reloads
// it when either file changes (size or modification time), so a rotated
// certificate takes effect at the next handshake without a restart. A pair
// that fails to load is logged and the previous certificate kept.
type certReloader struct {
	certFile, keyFile string
	log               zerolog.Logger

	mu       sync.Mutex
	cert     *tls.Certificate
	certStat fileStamp
	keyStat  fileStamp
}

type fileStamp struct {
	size int64
	mod  time.Time
}

func stamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{fi.Size(), fi.ModTime()}, nil
}

func newCertReloader(certFile, keyFile string, log zerolog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

// load reads the pair; the caller holds mu or owns r.
func (r *certReloader) load() error {
	cs, err := stamp(r.certFile)
	if err != nil {
		return fmt.Errorf("grpc TLS certificate: %w", err)
	}
	ks, err := stamp(r.keyFile)
	if err != nil {
		return fmt.Errorf("grpc TLS key: %w", err)
	}
	c, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("grpc TLS key pair: %w", err)
	}
	r.cert, r.certStat, r.keyStat = &c, cs, ks
	return nil
}

// get is tls.Config.GetCertificate: two stats per handshake, a reload
// only when a file changed.
func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, err1 := stamp(r.certFile)
	ks, err2 := stamp(r.keyFile)
	if err1 == nil && err2 == nil && (cs != r.certStat || ks != r.keyStat) {
		if err := r.load(); err != nil {
			r.log.Warn().Err(err).Msg("grpc TLS reload failed; keeping the previous certificate")
			// Do not retry on every handshake until a file changes again.
			r.certStat, r.keyStat = cs, ks
		} else {
			r.log.Info().Msg("grpc TLS certificate reloaded")
		}
	}
	return r.cert, nil
}
