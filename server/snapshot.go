package server

import (
	"bufio"

	"github.com/valyala/fasthttp"
)

// snapshotPath is the route peers fetch the index from.
const snapshotPath = "/snapshot"

// serveSnapshot streams Options.Snapshot's output. The cut and the copy
// happen while the response is written, so the handler returns at once and
// other requests are not held; a failure midway cuts the stream short,
// which the peer detects (every section carries a checksum).
func (s *Server) serveSnapshot(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/octet-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		if err := s.opts.Snapshot(w); err != nil {
			s.opts.Logger.Warn().Err(err).Msg("snapshot stream to a peer failed")
			return
		}
		if err := w.Flush(); err != nil {
			s.opts.Logger.Warn().Err(err).Msg("snapshot stream to a peer failed")
		}
	})
}
