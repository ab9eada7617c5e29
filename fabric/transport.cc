// fabric as core's Transport (core/module_transport.h): the client's offer is the UDP
// rendezvous (a REQ answered before the SYN), the listener's twin its UDP socket. What each
// step does and why is in fabric/stream.h and docs/DESIGN.md ("Detection across hosts
// (fabric)"). And since libfabric makes its own sockets and waits, this face tells its
// calls from the application's (IsLibraryCaller).
#include "fabric/transport.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <new>

#include "core/log.h"
#include "core/module_transport.h"
#include "core/no_destructor.h"
#include "fabric/library_path.h"
#include "fabric/options.h"
#include "fabric/stream.h"

namespace slip::fabric {

namespace {

// Where libfabric's code and this transport's module lie once loaded
// (IsTransportLibraryPath), so that a face can tell their calls apart with a few
// comparisons (libfabric's epoll_wait and poll run on every progress call).
struct TransportCode {
  struct Range {
    uintptr_t lo, hi;
  };
  static constexpr int kMax = 16;
  Range ranges[kMax] = {};
  std::atomic<int> count{-1};  // -1: not known yet
};
TransportCode g_code;
// Whether the module was ever asked for: the one load that the application's interposed
// calls pay before libc's (a global, not a member behind a static's guard).
std::atomic<bool> g_in_use{false};

void NoteTransportCode() noexcept {
  struct Found {
    int count = 0;
    int dropped = 0;  // code segments past kMax
  } found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) -> int {
        auto* f = static_cast<Found*>(arg);
        if (!info->dlpi_name || !IsTransportLibraryPath(info->dlpi_name)) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          if (f->count == TransportCode::kMax) {
            ++f->dropped;
            continue;
          }
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          g_code.ranges[f->count++] = {lo, lo + ph.p_memsz};
        }
        return 0;
      },
      &found);
  g_code.count.store(found.count, std::memory_order_release);
  // Calls from the code left out would be taken for the application's (the re-entry the
  // check exists to prevent): said, so that a host with that many provider libraries
  // shows why.
  if (found.dropped > 0)
    SLIP_LOG(kWarn,
             "fabric: %d code segments of libfabric, its providers or the stream module beyond the "
             "%d this face tells apart; their calls may be taken for the application's",
             found.dropped, TransportCode::kMax);
}

// Whether `code` lies in libfabric, one of its providers or the module.
bool IsTransportCode(const void* code) noexcept {
  const int n = g_code.count.load(std::memory_order_acquire);
  if (n < 0) {
    // Still loading (libfabric and its providers are being opened): asked by name.
    Dl_info info{};
    return dladdr(code, &info) != 0 && info.dli_fname && IsTransportLibraryPath(info.dli_fname);
  }
  const auto pc = uintptr_t(code);
  for (int i = 0; i < n; ++i)
    if (pc >= g_code.ranges[i].lo && pc < g_code.ranges[i].hi) return true;
  return false;
}

class FabricTwin final : public RingTwin<StreamModule> {
 public:
  FabricTwin(StreamModule* m, StreamListener* l, const Config* config) noexcept
      : RingTwin(m, l, config) {}
  ~FabricTwin() override { m_->Unlisten(l_); }
  // (No ServiceFd: REQs are answered by the module's progress thread alone. A client sends
  // its SYN only once it has our REP, so accept() finds its request kept already and
  // never reads the socket, where a flood would run on the application's thread.)
  void SharedByProcesses() noexcept override { m_->Share(l_); }
  void BeforeFork() noexcept override { m_->Share(l_); }
};

class FabricTransport final : public ModuleTransport<StreamModule, Options> {
 public:
  FabricTransport() noexcept : ModuleTransport(kModule, kOptionTable) {}

  void BeforeExec() noexcept override {
    if (StreamModule* m = Loaded()) m->BeforeExec();
  }
  LibraryCheck IsLibraryCaller() const noexcept override {
    return [](const void* code) noexcept {
      return g_in_use.load(std::memory_order_acquire) && IsTransportCode(code);
    };
  }
  void LibraryAccepted(int listening, int conn) noexcept override {
    if (StreamModule* m = Loaded()) m->ProviderAccepted(listening, conn);
  }

  std::unique_ptr<ListenerTwin> Listen(const ListenRequest& req, Reason* why) noexcept override {
    // SO_REUSEPORT: the kernel hands each SYN to one of the group's sockets, which a REQ
    // cannot know in advance (verbs' groups are not built for fabric): plain.
    *why = Reason::kReusePort;
    if (req.reuseport) return nullptr;
    StreamModule* m = Get(req.config);
    *why = Reason::kNoRdmaDevice;
    if (!m) return nullptr;
    StreamListener* l = m->Listen(req.local, req.v6only, why);
    if (!l) return nullptr;
    std::unique_ptr<ListenerTwin> twin(new (std::nothrow) FabricTwin(m, l, req.config));
    if (!twin) {
      m->Unlisten(l);
      *why = Reason::kResources;
    }
    return twin;
  }

 private:
  // libfabric's code is known from the load on (its own sockets and waits go to libc).
  void BeforeLoad() noexcept override { g_in_use.store(true, std::memory_order_release); }
  void AfterLoad() noexcept override { NoteTransportCode(); }
};

}  // namespace

Transport* TheTransport() noexcept {
  static NoDestructor<FabricTransport> transport;  // connections may be made during exit
  return transport.get();
}

}  // namespace slip::fabric
