package subscriber

/*
#cgo !windows pkg-config: libzmq
#include <zmq.h>
#include <errno.h>
#include <stdlib.h>

// A batch holds up to CB_MSGS received messages as open zmq_msg_t frames,
// at most CB_KEEP frames per message (further frames are received and
// closed at once, only counted), so the caller can read every frame in
// place until the next receive.
enum { CB_SLOTS = 256, CB_KEEP = 4, CB_MSGS = 64 };

typedef struct { void *data; size_t size; } cb_frame;
typedef struct { int first; int count; } cb_msg;

typedef struct {
	int held; // msgs[0..held) are open
	// results of cb_recv, kept here rather than in Go variables whose
	// addresses, passed to C, would make them escape to the heap
	int err, partial;
	size_t total;
	cb_frame frames[CB_SLOTS];
	cb_msg info[CB_MSGS];
	zmq_msg_t msgs[CB_SLOTS];
} cb_batch;

static cb_batch *cb_new(void) { return (cb_batch *)calloc(1, sizeof(cb_batch)); }

static void cb_release(cb_batch *b) {
	while (b->held > 0) zmq_msg_close(&b->msgs[--b->held]);
}

static void cb_free(cb_batch *b) {
	cb_release(b);
	free(b);
}

// cb_recv_part receives one frame, retrying after EINTR as pebbe's default
// context does; it returns 0 or the errno.
static int cb_recv_part(zmq_msg_t *m, void *sock, int flags) {
	for (;;) {
		if (zmq_msg_recv(m, sock, flags) >= 0) return 0;
		int e = zmq_errno();
		if (e != EINTR) return e;
	}
}

// cb_recv releases the previous batch, then receives whole messages without
// blocking until the socket is empty, max_msgs messages are held, the frame
// slots run out or max_bytes of frames are held (at least one message is
// always taken). Only a message's first frame is received with DONTWAIT:
// ZMQ delivers multipart messages atomically, so the rest is already there.
// It returns the number of complete messages; b->err is 0 when a limit
// ended the batch, otherwise the errno that did (EAGAIN: nothing more
// queued), b->partial tells that the error came after a message's first
// frame (that message's frames are dropped), and b->total is the frame
// bytes of the complete messages.
static int cb_recv(void *sock, cb_batch *b, int max_msgs, size_t max_bytes) {
	cb_release(b);
	b->err = 0;
	b->partial = 0;
	b->total = 0;
	if (max_msgs > CB_MSGS) max_msgs = CB_MSGS;
	int n = 0;
	size_t bytes = 0;
	while (n < max_msgs && b->held + CB_KEEP <= CB_SLOTS && bytes < max_bytes) {
		int first = b->held, count = 0, flags = ZMQ_DONTWAIT;
		for (;;) {
			zmq_msg_t extra;
			zmq_msg_t *m = count < CB_KEEP ? &b->msgs[b->held] : &extra;
			zmq_msg_init(m);
			int e = cb_recv_part(m, sock, flags);
			if (e != 0) {
				zmq_msg_close(m);
				while (b->held > first) zmq_msg_close(&b->msgs[--b->held]);
				b->err = e;
				b->partial = count > 0;
				return n;
			}
			flags = 0;
			int more = zmq_msg_more(m);
			if (count < CB_KEEP) {
				b->frames[b->held].data = zmq_msg_data(m);
				b->frames[b->held].size = zmq_msg_size(m);
				bytes += zmq_msg_size(m);
				b->held++;
			} else {
				zmq_msg_close(m);
			}
			count++;
			if (!more) break;
		}
		b->info[n].first = first;
		b->info[n].count = count;
		n++;
		b->total = bytes;
	}
	return n;
}
*/
import "C"

import (
	"fmt"
	"reflect"
	"runtime/debug"
	"sync"
	"syscall"
	"unsafe"

	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
	zmq "github.com/pebbe/zmq4"
)

// batchMaxBytes bounds the frame bytes one batch holds open, so a burst of
// large messages does not pin many megabytes of libzmq buffers at once.
const batchMaxBytes = 4 << 20

// pebbeSocket is zmq.Socket as github.com/pebbe/zmq4 v1.4.0 declares it
// (go.mod pins that version): rawSocket reads the libzmq handle, the
// unexported first field, through it.
//
// Why reach into pebbe at all: the receive path is per frame there (a cgo
// call each for init, recv, copy and close, one for RCVMORE, and a Go
// allocation per frame); receiving a batch with one cgo call ingests
// markedly more blocks per CPU-second (BENCHMARKS.md, BenchmarkIngestVLLM).
// Batching needs the raw void* socket, which pebbe does not export. The
// alternatives were worse: creating the SUB socket in our own C code would
// lose pebbe's Poller and the replay client's watch list, both of which
// take *zmq.Socket; parsing Socket.String() relies on a print format.
//
// A pebbe release that changes the layout must not be misread, nor
// silently slower: the build fails when zmq.Socket's size or alignment
// differs from this mirror (the array lengths below go negative); when a
// field's name, type or offset differs (checkSocketLayout), or the binary
// was built with another pebbe release, CheckZMQBinding says so, the
// service refuses to start with that error and Start refuses every
// subscriber. Commands that open no event socket (--version, hash) still
// run, so an operator can tell which build it is.
type pebbeSocket struct {
	soc    unsafe.Pointer
	ctx    *zmq.Context
	opened bool
	err    error
}

// pebbePath is the module pebbeSocket mirrors a type of.
const pebbePath = "github.com/pebbe/zmq4"

// pebbeVersion is the pebbe/zmq4 release pebbeSocket mirrors. It is a
// variable only so that a test can link a binary that claims another
// release (-ldflags -X); nothing assigns it at run time.
var pebbeVersion = "v1.4.0"

var (
	_ [unsafe.Sizeof(zmq.Socket{}) - unsafe.Sizeof(pebbeSocket{})]struct{}
	_ [unsafe.Sizeof(pebbeSocket{}) - unsafe.Sizeof(zmq.Socket{})]struct{}
	_ [unsafe.Alignof(zmq.Socket{}) - unsafe.Alignof(pebbeSocket{})]struct{}
	_ [unsafe.Alignof(pebbeSocket{}) - unsafe.Alignof(zmq.Socket{})]struct{}
)

// layoutErr is checkSocketLayout's verdict on the zmq.Socket this binary
// was compiled with, fixed at initialisation (a property of the build,
// never changed after).
var layoutErr = checkSocketLayout(reflect.TypeFor[zmq.Socket]())

// CheckZMQBinding says whether the receive path can read pebbe/zmq4's
// sockets in this build: bi (debug.ReadBuildInfo) must name the pebbe/zmq4
// release pebbeSocket mirrors, unreplaced, and zmq.Socket must be laid out
// as the mirror. Build information without dependencies (a test binary's)
// leaves only the layout to check. The error names both releases.
func CheckZMQBinding(bi *debug.BuildInfo) error {
	if bi != nil {
		for _, d := range bi.Deps {
			if d.Path != pebbePath {
				continue
			}
			if d.Replace != nil {
				return fmt.Errorf("this build replaces %s %s with %s %s; the event receive path mirrors zmq.Socket of %s %s only: check pebbeSocket in subscriber/recv_cgo.go against it", pebbePath, d.Version, d.Replace.Path, d.Replace.Version, pebbePath, pebbeVersion)
			}
			if d.Version != pebbeVersion {
				return fmt.Errorf("this build has %s %s; the event receive path mirrors zmq.Socket of %s only: check pebbeSocket in subscriber/recv_cgo.go against %s, then update pebbeVersion", pebbePath, d.Version, pebbeVersion, d.Version)
			}
		}
	}
	if layoutErr != nil {
		return fmt.Errorf("%w; adapt pebbeSocket in subscriber/recv_cgo.go to this %s release", layoutErr, pebbePath)
	}
	return nil
}

// checkSocketLayout compares t, field by field, with pebbeSocket.
func checkSocketLayout(t reflect.Type) error {
	want := reflect.TypeFor[pebbeSocket]()
	if t.NumField() != want.NumField() {
		return fmt.Errorf("zmq.Socket has %d fields, pebbe/zmq4 %s has %d", t.NumField(), pebbeVersion, want.NumField())
	}
	for i := range want.NumField() {
		g, w := t.Field(i), want.Field(i)
		if g.Name != w.Name || g.Type != w.Type || g.Offset != w.Offset {
			return fmt.Errorf("zmq.Socket field %d is %s %v at %d, pebbe/zmq4 %s has %s %v at %d", i, g.Name, g.Type, g.Offset, pebbeVersion, w.Name, w.Type, w.Offset)
		}
	}
	return nil
}

// rawSocket returns the libzmq handle behind sock (nil once it is closed).
func rawSocket(sock *zmq.Socket) unsafe.Pointer {
	return (*pebbeSocket)(unsafe.Pointer(sock)).soc
}

// batchReceiver receives live messages many at a time with one cgo call
// and hands them out one by one. Frames are read in place from libzmq's
// messages (no copy, no Go allocation): a message's frames stay valid until
// the next fill, which happens only once every queued message was handed
// out. Handlers must therefore copy whatever they keep past their return
// (recovery buffering does). The C batch is taken from the shared
// free list while a drain runs and returned when it ends empty, so idle
// sources hold none.
type batchReceiver struct {
	shared   *Resources // the batch free list and the trimmer
	b        *C.cb_batch
	n, next  int   // queued messages are info[next:n]
	deferred error // error that ended the last fill after some messages
	// backlog is set when a fill stopped at a limit rather than at an empty
	// socket, i.e. messages were waiting in libzmq; bytes counts what was
	// received since the last trim request (see noteEmpty).
	backlog bool
	bytes   int
}

// queued reports messages received from the socket but not yet handed out.
func (r *batchReceiver) queued() bool { return r.next < r.n }

// recv returns the next queued message's frames appended to frames (the
// first four, then a nil per extra frame up to five entries, like
// zmqx.RecvMessage), filling the queue from sock when it is empty. limit bounds how
// many messages a fill takes, so that a drain does not leave messages
// queued behind an empty socket. Errors are those of zmqx.RecvMessage: EAGAIN
// (as zmq.Errno) when nothing is queued.
func (r *batchReceiver) recv(sock *zmq.Socket, frames [][]byte, limit int) ([][]byte, error) {
	if r.next == r.n {
		if err := r.deferred; err != nil {
			r.deferred = nil
			return frames, err
		}
		if err := r.fill(sock, limit); err != nil {
			return frames, err
		}
	}
	info := &r.b.info[r.next]
	r.next++
	first, count := int(info.first), int(info.count)
	kept := min(count, 4)
	for i := first; i < first+kept; i++ {
		f := &r.b.frames[i]
		frames = append(frames, unsafe.Slice((*byte)(f.data), int(f.size)))
	}
	for len(frames) < count && len(frames) < 5 {
		frames = append(frames, nil)
	}
	return frames, nil
}

// fill releases the previous batch and receives the next one.
func (r *batchReceiver) fill(sock *zmq.Socket, limit int) error {
	h := rawSocket(sock)
	if h == nil {
		return zmq.ErrorSocketClosed
	}
	if r.b == nil {
		r.b = r.shared.batches.get()
	}
	n := int(C.cb_recv(h, r.b, C.int(max(limit, 1)), C.size_t(batchMaxBytes)))
	cerr, partial := r.b.err, r.b.partial
	r.n, r.next = n, 0
	r.bytes += int(r.b.total)
	if cerr == 0 {
		r.backlog = true
		r.shared.trim.NoteBacklog()
	}
	var err error
	if cerr != 0 {
		err = zmq.Errno(cerr)
		if partial != 0 {
			err = fmt.Errorf("receive frame: %w", err)
		}
	}
	if n == 0 {
		if err == nil { // cannot happen: a limit always admits one message
			err = zmq.Errno(syscall.EAGAIN)
		}
		if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
			r.noteEmpty()
		}
		return err
	}
	if err != nil && zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
		// Reported after the messages received before it, in order.
		r.deferred = err
	}
	return nil
}

// noteEmpty is called when the socket has nothing queued. If it had a
// backlog of at least zmqx.TrimAfterBytes since the last request, the C heap
// that backlog occupied is now free, and a trim is requested: glibc keeps
// freed memory of libzmq's I/O thread arena otherwise, so RSS stays at the
// burst's peak.
func (r *batchReceiver) noteEmpty() {
	if r.backlog && r.bytes >= zmqx.TrimAfterBytes {
		r.shared.trim.Request()
		r.backlog, r.bytes = false, 0
	} else if !r.backlog {
		r.bytes = 0 // steady traffic the subscriber keeps up with
	}
}

// idle returns the C batch to the free list when nothing is queued; the
// frames handed out so far become invalid.
func (r *batchReceiver) idle() {
	if r.b == nil || r.queued() || r.deferred != nil {
		return
	}
	r.shared.batches.put(r.b)
	r.b, r.n, r.next = nil, 0, 0
}

// discard drops queued messages and the batch: the socket is being closed
// or the subscriber exits, and a deferred error no longer matters.
func (r *batchReceiver) discard() {
	r.n, r.next, r.deferred = 0, 0, nil
	r.idle()
}

// batchPool keeps a few released C batches for reuse (Resources owns one for
// every subscriber of the process); more than maxIdleBatches are freed, so
// the list is bounded by the drains running at once, not by the number of
// registered sources. sync.Pool cannot hold C memory.
type batchPool struct {
	mu   sync.Mutex
	list []*C.cb_batch
}

const maxIdleBatches = 16

func (p *batchPool) get() *C.cb_batch {
	p.mu.Lock()
	if n := len(p.list); n > 0 {
		b := p.list[n-1]
		p.list = p.list[:n-1]
		p.mu.Unlock()
		return b
	}
	p.mu.Unlock()
	b := C.cb_new()
	if b == nil {
		panic("subscriber: out of C memory for a receive batch")
	}
	return b
}

func (p *batchPool) put(b *C.cb_batch) {
	C.cb_release(b) // closes the messages: frames handed out are now invalid
	p.mu.Lock()
	if len(p.list) < maxIdleBatches {
		p.list = append(p.list, b)
		b = nil
	}
	p.mu.Unlock()
	if b != nil {
		C.cb_free(b)
	}
}

// close frees the idle batches.
func (p *batchPool) close() {
	p.mu.Lock()
	list := p.list
	p.list = nil
	p.mu.Unlock()
	for _, b := range list {
		C.cb_free(b)
	}
}
