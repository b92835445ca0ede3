// Package eventtest is test support shared by the events and subscriber
// packages (and any other package that needs to wait on a condition): the
// event fixture manifest loader, recording index sinks, the translation of
// fixture effects into the sink calls they imply, and a polling wait.
//
// It exists so that the decoder tests (events, no sockets) and the
// subscription tests (subscriber, real ZMQ) read the same fixtures the same
// way instead of each carrying a copy. It may be imported only from _test.go
// files; TestImportedOnlyByTests enforces that. It must not import events or
// subscriber, whose in-package tests import it.
package eventtest
