// The NCCL face over the transports' message comms (net.h).
#include "ncclnet-plugin/net.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>

#include "core/config.h"
#include "core/log.h"
#include "core/module_loader.h"
#include "core/msg_comm.h"
#include "fabric/msg.h"
#include "fabric/options.h"
#include "gpudirect/gpudirect.h"
#include "shm/msg.h"
#include "verbs/msg.h"
#include "verbs/options.h"

namespace slip::nccl {

namespace {

using msg::Status;

// What NCCL holds: each comm it is handed, tagged with what it is.
enum class CommKind : uint32_t { kListen = 0x4c49534e, kSend = 0x53454e44, kRecv = 0x52454356 };

struct FaceComm {
  explicit FaceComm(CommKind k) noexcept : kind(k) {}
  virtual ~FaceComm() = default;
  const CommKind kind;
  int dev = 0;  // the (virtual) device it was made on
};
struct ListenComm final : FaceComm {
  ListenComm() noexcept : FaceComm(CommKind::kListen) {}
  std::unique_ptr<msg::Listener> listener;
};
struct SendComm final : FaceComm {
  SendComm() noexcept : FaceComm(CommKind::kSend) {}
  std::unique_ptr<msg::SendComm> comm;
};
struct RecvComm final : FaceComm {
  RecvComm() noexcept : FaceComm(CommKind::kRecv) {}
  std::unique_ptr<msg::RecvComm> comm;
};

// A registration as NCCL holds it: the transport's (null for one that copies with the CPU:
// shm) and the comm it was made with; the magic lets deregMr refuse what is not ours.
struct MemoryRegion {
  static constexpr uint32_t kMagic = 0x534c4d52;  // "SLMR"
  uint32_t magic = kMagic;
  const FaceComm* face = nullptr;
  msg::Memory* memory = nullptr;
  bool device = false;  // GPU memory: receives into it are flushed
};

// The transport comm under a send or receive comm NCCL holds (null for a listen comm).
msg::Comm* CommOf(FaceComm* face) noexcept {
  switch (face->kind) {
    case CommKind::kSend:
      return static_cast<SendComm*>(face)->comm.get();
    case CommKind::kRecv:
      return static_cast<RecvComm*>(face)->comm.get();
    case CommKind::kListen:
      break;
  }
  return nullptr;
}

msg::Memory* MemoryOf(void* mhandle) noexcept {
  auto* mr = static_cast<MemoryRegion*>(mhandle);
  return mr != nullptr && mr->magic == MemoryRegion::kMagic ? mr->memory : nullptr;
}

// A device as NCCL sees it: one transport device, or several merged (makeVDevice).
struct VirtualDevice {
  ncclNetVDeviceProps_v9_t props{};
  char name[80] = {};
};
constexpr int kMaxVirtualDevices = 16;
constexpr int kMaxPhysicalDevices = 8;
// NCCL calls connect/accept again until they complete; past this they fail.
constexpr uint32_t kConnectTimeoutMs = 20000;

struct State {
  std::mutex mu;
  bool initialised = false;
  Config config;
  std::unordered_set<const void*> live;  // comms NCCL holds
  msg::Transport* physical[kMaxPhysicalDevices] = {};
  int physical_count = 0;
  VirtualDevice vdevs[kMaxVirtualDevices];
  int vdev_count = 0;
};

State& S() noexcept {
  static State* state = new State();  // never destroyed: NCCL may call after exit starts
  return *state;
}

std::atomic<ncclDebugLogger_t> g_logger{nullptr};

void SinkToNccl(LogLevel level, const char* line) noexcept {
  ncclDebugLogger_t logger = g_logger.load(std::memory_order_acquire);
  if (logger == nullptr) return;
  // "slipstream[pid]: level: message": NCCL's logger says the pid and the level itself.
  const char* text = strstr(line, "]: ");
  text = text ? text + 3 : line;
  const ncclDebugLogLevel nccl_level = level <= LogLevel::kWarn   ? NCCL_LOG_WARN
                                       : level == LogLevel::kInfo ? NCCL_LOG_INFO
                                                                  : NCCL_LOG_TRACE;
  logger(nccl_level, NCCL_NET | NCCL_INIT, "slipstream", 0, "NET/Slipstream : %s", text);
}

ncclResult_t ToNccl(Status s) noexcept {
  switch (s) {
    case Status::kOk:
    case Status::kAgain:
      return ncclSuccess;
    case Status::kBadArgument:
      return ncclInvalidArgument;
    case Status::kRemote:
      return ncclRemoteError;
    case Status::kSystem:
      return ncclSystemError;
    case Status::kInternal:
      return ncclInternalError;
  }
  return ncclInternalError;
}

// A virtual device's comms go through its first device (merged devices are not striped).
msg::Transport* TransportOf(int dev) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  return s.physical[s.vdevs[dev].props.devs[0]];
}

// HOST always; CUDA where the device registers GPU memory (by DMA-BUF the driver exports,
// or by address through a peer-memory client) and the CUDA driver sees a GPU; DMABUF where
// both the device and the driver do DMA-BUF.
int PtrSupportOf(const msg::DeviceInfo& info) noexcept {
  const gpudirect::DriverInfo& cuda = gpudirect::Driver();
  if (!info.registers || !cuda.loaded || cuda.devices == 0) return NCCL_PTR_HOST;
  const bool dmabuf = info.dmabuf && cuda.dmabuf;
  if (!dmabuf && !info.peer_memory) return NCCL_PTR_HOST;
  return NCCL_PTR_HOST | NCCL_PTR_CUDA | (dmabuf ? NCCL_PTR_DMABUF : 0);
}

bool g_flush_host = false;  // SLIP_NCCL_FLUSH=1
int g_queue_pairs = 1;      // SLIP_NCCL_QPS

// The face's own variables: SLIP_NCCL_QPS (1..4, queue pairs per verbs comm) and
// SLIP_NCCL_FLUSH (0 or 1: flush receives into host memory too). False, with a line, on a
// bad value.
bool ReadFaceVariables() noexcept {
  if (const char* qps = getenv("SLIP_NCCL_QPS")) {
    if (qps[0] < '1' || qps[0] > '4' || qps[1] != '\0') {
      SLIP_LOG(kError, "SLIP_NCCL_QPS=%s: expected 1 to 4 (queue pairs per comm)", qps);
      return false;
    }
    g_queue_pairs = qps[0] - '0';
  }
  if (const char* flush = getenv("SLIP_NCCL_FLUSH")) {
    if ((flush[0] != '0' && flush[0] != '1') || flush[1] != '\0') {
      SLIP_LOG(kError, "SLIP_NCCL_FLUSH=%s: expected 0 or 1", flush);
      return false;
    }
    g_flush_host = flush[0] == '1';
  }
  return true;
}

verbs::Options g_verbs_options;  // the modules keep pointers to them
fabric::Options g_fabric_options;

// A transport module's devices, into s.physical: its options read (`parse`), the module
// loaded from beside the plugin, its entry point `symbol` given `setup` (whose `options`
// points at `options`). 0 when the transport is not allowed, not built, or finds no
// usable device (said once).
template <typename Options, typename Setup>
int LoadModule(State& s, TransportKind kind, const char* library, const char* symbol,
               bool (*parse)(EnvLookup, void*, Options*, std::string*), Options* options,
               Setup setup, LogLevel level) noexcept {
  const char* name = TransportName(kind);
  if (!s.config.Allows(kind)) return 0;
  std::string error;
  auto lookup = [](const char* var, void*) -> const char* { return getenv(var); };
  if (!parse(lookup, nullptr, options, &error)) {
    SLIP_LOG(kError, "%s: no %s devices", error.c_str(), name);
    return 0;
  }
  char why[256] = "";
  // (The training process's signals stay its own: libfabric's PSM would exit(1) on SIGINT.)
  KeepSignalDispositions keep(name);
  void* module = OpenModuleBeside(reinterpret_cast<const void*>(&Init), library, why, sizeof(why));
  using Entry = int (*)(const Setup*, msg::Transport**, int, char*, size_t);
  auto entry = module ? reinterpret_cast<Entry>(dlsym(module, symbol)) : nullptr;
  if (module && !entry) snprintf(why, sizeof(why), "the %s module has no message face", name);
  int n = 0;
  if (entry) {
    setup.options = options;
    setup.log_level = level;
    setup.log_sink = g_logger.load(std::memory_order_relaxed) ? SinkToNccl : nullptr;
    setup.connect_timeout_ms = kConnectTimeoutMs;
    n = entry(&setup, s.physical, kMaxPhysicalDevices, why, sizeof(why));
  }
  if (n <= 0) {
    SLIP_LOG(kInfo, "no %s devices: %s", name, why);
    return 0;
  }
  return n;
}

int LoadVerbs(State& s, LogLevel level) noexcept {
  verbs::MessageSetup setup;
  setup.flush_host_memory = g_flush_host;
  setup.queue_pairs = g_queue_pairs;
  return LoadModule(s, TransportKind::kVerbs, "libslipstream-verbs.so",
                    "slip_verbs_message_transports", verbs::ParseOptions, &g_verbs_options, setup,
                    level);
}

int LoadFabric(State& s, LogLevel level) noexcept {
  return LoadModule(s, TransportKind::kFabric, "libslipstream-fabric.so",
                    "slip_fabric_message_transports", fabric::ParseOptions, &g_fabric_options,
                    fabric::MessageSetup{}, level);
}

bool Track(const FaceComm* comm) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  try {
    s.live.insert(comm);
  } catch (...) {
    return false;
  }
  return true;
}

// Takes `comm` out of the live table if it is a live comm of `kind`.
bool Untrack(const void* comm, CommKind kind) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.live.find(comm);
  if (it == s.live.end() || static_cast<const FaceComm*>(comm)->kind != kind) return false;
  s.live.erase(it);
  return true;
}

bool IsLive(const void* comm) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  return s.live.count(comm) != 0;
}

template <typename T>
ncclResult_t Close(void* comm, CommKind kind, const char* what) noexcept {
  if (comm == nullptr || !Untrack(comm, kind)) {
    SLIP_LOG(kWarn, "%s of %p: not a live comm of ours (closed twice?): refused", what, comm);
    return ncclInvalidArgument;
  }
  delete static_cast<T*>(comm);  // requests in flight go with it
  return ncclSuccess;
}

}  // namespace

ncclResult_t Init(ncclDebugLogger_t logger) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (logger != nullptr) {
    g_logger.store(logger, std::memory_order_release);
    LogSetSink(SinkToNccl);
  }
  if (s.initialised) return ncclSuccess;
  std::string error;
  if (!ParseConfigFromEnv(&s.config, &error)) {
    SLIP_LOG(kError, "%s: the plugin offers no network", error.c_str());
    return ncclInvalidArgument;
  }
  // Into NCCL's logger, NCCL's own filter (NCCL_DEBUG, NCCL_DEBUG_SUBSYS) decides what
  // shows; without one (a harness), SLIP_LOG does.
  const bool nccl_filters =
      g_logger.load(std::memory_order_relaxed) != nullptr && s.config.log_level < LogLevel::kInfo;
  const LogLevel level = nccl_filters ? LogLevel::kInfo : s.config.log_level;
  LogInit(level, nullptr);
  if (!s.config.enabled) {
    SLIP_LOG(kWarn, "SLIP_ENABLE=0: the plugin offers no network");
    return ncclInternalError;
  }
  // RDMA devices when there are any: NCCL's network is for traffic between hosts, which
  // shm cannot carry. Without one, shm: ranks of one host made to look like several
  // (containers, NCCL_HOSTID), and every machine can run the plugin.
  if (!ReadFaceVariables()) return ncclInvalidArgument;
  // The network transports in the user's order (SLIP_TRANSPORTS): the first with devices.
  for (TransportKind kind : s.config.transports) {
    if (kind == TransportKind::kVerbs) s.physical_count = LoadVerbs(s, level);
    if (kind == TransportKind::kFabric) s.physical_count = LoadFabric(s, level);
    if (s.physical_count > 0) break;
  }
  if (s.physical_count == 0) {
    if (!s.config.Allows(TransportKind::kShm)) {
      SLIP_LOG(kWarn,
               "no verbs or fabric devices and SLIP_TRANSPORTS without shm: the plugin offers no "
               "network");
      return ncclInternalError;
    }
    shm::SetMessageRingSize(s.config.ring_size);
    if (!s.config.rendezvous_dir.empty())
      shm::SetMessageRendezvousDir(s.config.rendezvous_dir.c_str());
    s.physical[0] = shm::MessageTransport();
    s.physical_count = 1;
    SLIP_LOG(kInfo, "shm message comms, ring %u KiB per comm", unsigned(s.config.ring_size >> 10));
  }
  for (int d = 0; d < s.physical_count; ++d) {
    VirtualDevice& v = s.vdevs[s.vdev_count++];
    v.props.ndevs = 1;
    v.props.devs[0] = d;
    snprintf(v.name, sizeof(v.name), "slipstream-%s", s.physical[d]->device().name);
  }
  const gpudirect::DriverInfo& cuda = gpudirect::Driver();
  if (cuda.loaded && cuda.devices > 0) {
    SLIP_LOG(kInfo,
             "CUDA driver %d, %d device(s), DMA-BUF %s; registrations of device memory are "
             "not offered yet, so NCCL stages it through host buffers (ptrSupport HOST)",
             cuda.version, cuda.devices, cuda.dmabuf ? "supported" : "not supported");
  } else {
    SLIP_LOG(kInfo, "GPUDirect off: %s; host memory only (ptrSupport HOST)", cuda.why);
  }
  s.initialised = true;
  return ncclSuccess;
}

ncclResult_t Devices(int* ndev) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  *ndev = s.vdev_count;
  return ncclSuccess;
}

ncclResult_t GetProperties(int dev, Properties* props) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (dev < 0 || dev >= s.vdev_count) return ncclInvalidArgument;
  const VirtualDevice& v = s.vdevs[dev];
  const msg::DeviceInfo& info = s.physical[v.props.devs[0]]->device();
  *props = Properties{};
  props->name = v.name;
  // None (shared memory, a virtual RDMA device): NCCL places the device at the CPU.
  props->pci_path = info.pci_path[0] ? info.pci_path : nullptr;
  props->guid = info.guid | uint64_t(dev);
  props->ptr_support = PtrSupportOf(info);
  // shm's registration is nothing but a note, valid for any comm; an RDMA transport's is
  // made in one comm's protection domain (its peer reaches nothing else).
  props->reg_is_global = info.registers ? 0 : 1;
  props->speed_mbps = info.speed_mbps;
  props->latency_us = info.latency_us;
  props->max_comms = 65536;
  props->max_recvs = msg::kMaxGroup;
  props->vprops = v.props;
  // test() reports sizes as int.
  props->max_p2p_bytes = INT_MAX;
  props->max_coll_bytes = INT_MAX;
  return ncclSuccess;
}

ncclResult_t MakeVDevice(int* dev, ncclNetVDeviceProps_v9_t* props) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (props == nullptr || props->ndevs < 1 || props->ndevs > NCCL_NET_MAX_DEVS_PER_NIC)
    return ncclInvalidArgument;
  for (int i = 0; i < props->ndevs; ++i) {
    if (props->devs[i] < 0 || props->devs[i] >= s.physical_count) return ncclInvalidArgument;
    for (int j = 0; j < i; ++j)
      if (props->devs[j] == props->devs[i]) return ncclInvalidArgument;
  }
  if (s.vdev_count == kMaxVirtualDevices) return ncclInternalError;
  VirtualDevice& v = s.vdevs[s.vdev_count];
  v.props = *props;
  snprintf(v.name, sizeof(v.name), "slipstream-v%d", s.vdev_count);
  *dev = s.vdev_count++;
  return ncclSuccess;
}

ncclResult_t Listen(int dev, void* handle, void** listen_comm) noexcept {
  *listen_comm = nullptr;
  int ndev = 0;
  Devices(&ndev);
  if (dev < 0 || dev >= ndev || handle == nullptr) return ncclInvalidArgument;
  auto comm = std::unique_ptr<ListenComm>(new (std::nothrow) ListenComm());
  if (!comm) return ncclSystemError;
  std::memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  comm->dev = dev;
  if (Status st = TransportOf(dev)->Listen(static_cast<uint8_t*>(handle), &comm->listener);
      st != Status::kOk)
    return ToNccl(st) == ncclSuccess ? ncclSystemError : ToNccl(st);
  if (!Track(comm.get())) return ncclSystemError;
  *listen_comm = comm.release();
  return ncclSuccess;
}

ncclResult_t Connect(int dev, void* handle, void** send_comm,
                     ncclNetDeviceHandle_v8_t** send_dev_comm) noexcept {
  (void)send_dev_comm;  // no device offload
  *send_comm = nullptr;
  int ndev = 0;
  Devices(&ndev);
  if (dev < 0 || dev >= ndev || handle == nullptr) return ncclInvalidArgument;
  std::unique_ptr<msg::SendComm> conn;
  const Status st = TransportOf(dev)->Connect(static_cast<const uint8_t*>(handle), &conn);
  if (st == Status::kAgain) return ncclSuccess;  // NCCL calls again
  if (st != Status::kOk) return ToNccl(st);
  auto comm = std::unique_ptr<SendComm>(new (std::nothrow) SendComm());
  if (!comm) return ncclSystemError;
  comm->comm = std::move(conn);
  comm->dev = dev;
  if (!Track(comm.get())) return ncclSystemError;
  *send_comm = comm.release();
  return ncclSuccess;
}

ncclResult_t Accept(void* listen_comm, void** recv_comm,
                    ncclNetDeviceHandle_v8_t** recv_dev_comm) noexcept {
  (void)recv_dev_comm;
  *recv_comm = nullptr;
  if (listen_comm == nullptr || !IsLive(listen_comm) ||
      static_cast<FaceComm*>(listen_comm)->kind != CommKind::kListen)
    return ncclInvalidArgument;
  std::unique_ptr<msg::RecvComm> conn;
  const Status st = static_cast<ListenComm*>(listen_comm)->listener->Accept(&conn);
  if (st == Status::kAgain) return ncclSuccess;
  if (st != Status::kOk) return ToNccl(st);
  auto comm = std::unique_ptr<RecvComm>(new (std::nothrow) RecvComm());
  if (!comm) return ncclSystemError;
  comm->comm = std::move(conn);
  comm->dev = static_cast<ListenComm*>(listen_comm)->dev;
  if (!Track(comm.get())) return ncclSystemError;
  *recv_comm = comm.release();
  return ncclSuccess;
}

namespace {

// Registers `region` with the comm NCCL names, as the handle NCCL keeps.
ncclResult_t Register(void* comm, const msg::Region& region, void** mhandle) noexcept {
  auto* mr = new (std::nothrow) MemoryRegion();
  if (mr == nullptr) return ncclSystemError;
  auto* face = static_cast<FaceComm*>(comm);
  mr->face = face;
  mr->device = region.device;
  if (msg::Comm* c = CommOf(face)) {
    if (Status st = c->Register(region, &mr->memory); st != Status::kOk) {
      delete mr;
      return ToNccl(st) == ncclSuccess ? ncclSystemError : ToNccl(st);
    }
  }
  *mhandle = mr;
  return ncclSuccess;
}

// GPU memory, for a device that registers it (ptrSupport CUDA): by address through a
// peer-memory client, else as a DMA-BUF the driver exports (`fd` < 0: we ask for one).
ncclResult_t RegisterDevice(void* comm, void* data, size_t size, uint64_t offset, int fd,
                            void** mhandle) noexcept {
  const auto* face = static_cast<const FaceComm*>(comm);
  if (!(PtrSupportOf(TransportOf(face->dev)->device()) & NCCL_PTR_CUDA)) {
    SLIP_LOG(kWarn,
             "regMr of CUDA memory on %s: it cannot register GPU memory (ptrSupport HOST): "
             "refused",
             TransportOf(face->dev)->device().name);
    return ncclInvalidArgument;
  }
  msg::Region region{data, size, true, fd, offset};
  int own_fd = -1;
  if (fd < 0 && !TransportOf(face->dev)->device().peer_memory) {
    own_fd = region.dmabuf_fd = gpudirect::DmaBufOf(data, size, &region.dmabuf_offset);
    if (own_fd < 0) {
      SLIP_LOG(kWarn, "regMr: the CUDA driver exports no DMA-BUF for %p (%zu bytes)", data, size);
      return ncclSystemError;
    }
  }
  const ncclResult_t rc = Register(comm, region, mhandle);
  if (own_fd >= 0) close(own_fd);  // the registration holds the buffer
  return rc;
}

}  // namespace

ncclResult_t RegMr(void* comm, void* data, size_t size, int type, void** mhandle) noexcept {
  *mhandle = nullptr;
  if (comm == nullptr || !IsLive(comm)) return ncclInvalidArgument;
  if (type == NCCL_PTR_CUDA) return RegisterDevice(comm, data, size, 0, -1, mhandle);
  if (type != NCCL_PTR_HOST) {
    SLIP_LOG(kWarn, "regMr of memory of type %d: refused", type);
    return ncclInvalidArgument;
  }
  if (size > 0) {
    const gpudirect::MemoryKind kind = gpudirect::Classify(data);
    if (kind == gpudirect::MemoryKind::kDevice) {
      SLIP_LOG(kWarn, "regMr: %p is device memory registered as host memory: refused", data);
      return ncclInvalidArgument;
    }
  }
  return Register(comm, msg::Region{data, size}, mhandle);
}

ncclResult_t RegMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                         void** mhandle) noexcept {
  *mhandle = nullptr;
  if (comm == nullptr || !IsLive(comm)) return ncclInvalidArgument;
  if (type != NCCL_PTR_CUDA || fd < 0) return RegMr(comm, data, size, type, mhandle);
  if (!(PtrSupportOf(TransportOf(static_cast<const FaceComm*>(comm)->dev)->device()) &
        NCCL_PTR_DMABUF)) {
    SLIP_LOG(kWarn, "regMrDmaBuf: this device does not register DMA-BUF memory: refused");
    return ncclInvalidArgument;
  }
  return RegisterDevice(comm, data, size, offset, fd, mhandle);
}

ncclResult_t DeregMr(void* comm, void* mhandle) noexcept {
  auto* mr = static_cast<MemoryRegion*>(mhandle);
  if (mr == nullptr || mr->magic != MemoryRegion::kMagic) return ncclInvalidArgument;
  // A comm closed first took its registrations with it; one that is live must be the one
  // the registration was made with.
  if (mr->memory != nullptr && comm != nullptr && IsLive(comm)) {
    if (comm != mr->face) return ncclInvalidArgument;
    if (CommOf(static_cast<FaceComm*>(comm))->Deregister(mr->memory) != Status::kOk)
      return ncclInvalidArgument;
  }
  mr->magic = 0;
  delete mr;
  return ncclSuccess;
}

ncclResult_t Isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                   void** request) noexcept {
  *request = nullptr;
  auto* comm = static_cast<SendComm*>(send_comm);
  if (comm == nullptr || comm->kind != CommKind::kSend) return ncclInvalidArgument;
  msg::Request* r = nullptr;
  const Status st = comm->comm->Send(data, size, tag, MemoryOf(mhandle), &r);
  *request = r;
  return ToNccl(st);
}

ncclResult_t Irecv(void* recv_comm, int n, void** data, const size_t* sizes, int* tags,
                   void** mhandles, void** request) noexcept {
  // (*request may hold NCCL_NET_OPTIONAL_RECV_COMPLETION: a hint we need not take; the
  // receive completes through test() either way.)
  *request = nullptr;
  auto* comm = static_cast<RecvComm*>(recv_comm);
  if (comm == nullptr || comm->kind != CommKind::kRecv) return ncclInvalidArgument;
  if (n < 1 || n > msg::kMaxGroup) return ncclInvalidArgument;
  msg::Memory* memory[msg::kMaxGroup] = {};
  for (int i = 0; i < n; ++i) memory[i] = mhandles ? MemoryOf(mhandles[i]) : nullptr;
  msg::Request* r = nullptr;
  const Status st = comm->comm->Recv(n, data, sizes, tags, memory, &r);
  *request = r;
  return ToNccl(st);
}

ncclResult_t Iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                    void** request) noexcept {
  *request = nullptr;
  auto* comm = static_cast<RecvComm*>(recv_comm);
  if (comm == nullptr || comm->kind != CommKind::kRecv || n < 1 || n > msg::kMaxGroup)
    return ncclInvalidArgument;
  // Host memory the CPU reads needs nothing (shm's own copies, or a NIC's writes, which
  // are coherent with the CPU); the transport flushes GPU memory.
  msg::Memory* memory[msg::kMaxGroup] = {};
  size_t lengths[msg::kMaxGroup] = {};
  for (int i = 0; i < n; ++i) {
    memory[i] = mhandles ? MemoryOf(mhandles[i]) : nullptr;
    lengths[i] = sizes && sizes[i] > 0 ? size_t(sizes[i]) : 0;
  }
  msg::Request* r = nullptr;
  const Status st = comm->comm->Flush(n, data, lengths, memory, &r);
  *request = r;
  return ToNccl(st);
}

ncclResult_t Test(void* request, int* done, int* sizes) noexcept {
  *done = 0;
  if (request == nullptr) return ncclInvalidArgument;
  bool finished = false;
  size_t got[msg::kMaxGroup];
  int count = 0;
  const Status st = msg::Test(static_cast<msg::Request*>(request), &finished, got, &count);
  if (st != Status::kOk) return ToNccl(st) == ncclSuccess ? ncclInternalError : ToNccl(st);
  if (finished) {
    *done = 1;
    if (sizes != nullptr)
      for (int i = 0; i < count; ++i) sizes[i] = got[i] > size_t(INT_MAX) ? INT_MAX : int(got[i]);
  }
  return ncclSuccess;
}

ncclResult_t CloseSend(void* send_comm) noexcept {
  return Close<SendComm>(send_comm, CommKind::kSend, "closeSend");
}

ncclResult_t CloseRecv(void* recv_comm) noexcept {
  return Close<RecvComm>(recv_comm, CommKind::kRecv, "closeRecv");
}

ncclResult_t CloseListen(void* listen_comm) noexcept {
  return Close<ListenComm>(listen_comm, CommKind::kListen, "closeListen");
}

}  // namespace slip::nccl
