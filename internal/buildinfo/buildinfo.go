// Package buildinfo says which build of the service is running: the release
// version and commit stamped at link time, the Go toolchain and the libzmq
// library the binary runs against. Operators read it from --version and the
// conductor_build_info metric when they compare engines and conductors.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"

	zmq "github.com/pebbe/zmq4"
)

// Set at link time, for example
//
//	go build -ldflags "-X github.com/mooncake-conductor-go/conductor/internal/buildinfo.version=v1.2.0 -X github.com/mooncake-conductor-go/conductor/internal/buildinfo.commit=$(git rev-parse HEAD)"
//
// Left empty, Get falls back to what the Go toolchain recorded.
var (
	version string
	commit  string
)

// Info describes the running binary.
type Info struct {
	Version   string
	Commit    string
	GoVersion string
	// LibZMQ is the version of the libzmq the process loaded, which can
	// differ from the headers it was built against.
	LibZMQ string
}

// Get returns the build's description. Without link-time values, the
// version is the module version when built as a dependency ("devel"
// otherwise) and the commit is the VCS revision Go stamps into binaries
// built from a checkout, with "-dirty" for uncommitted changes ("unknown"
// when there is none, as under go test or -buildvcs=false).
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, bi)
}

// resolve applies the fallbacks; it is separate from Get so tests can feed
// it build information.
func resolve(version, commit string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), LibZMQ: libzmq()}
	if bi != nil {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			var rev string
			dirty := false
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
			if rev != "" && dirty {
				rev += "-dirty"
			}
			info.Commit = rev
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

func libzmq() string {
	major, minor, patch := zmq.Version()
	return fmt.Sprintf("%d.%d.%d", major, minor, patch)
}

// String is the one line --version prints.
func (i Info) String() string {
	return fmt.Sprintf("conductor %s (commit %s, %s, libzmq %s)", i.Version, i.Commit, i.GoVersion, i.LibZMQ)
}
