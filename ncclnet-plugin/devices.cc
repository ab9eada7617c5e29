// The NCCL face's devices: init (the transports found through the message registry, in
// the user's order), the devices and their properties, virtual devices.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/log.h"
#include "core/msg_provider.h"
#include "gpudirect/gpudirect.h"
#include "ncclnet-plugin/face.h"

namespace slip::nccl {

namespace {

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

// The devices of the first transport, in the user's order, among those that reach other
// hosts (or, when `between_hosts` is false, those of one host) that finds any.
int FindDevices(State& s, const msg::FaceSetup& setup, bool between_hosts) noexcept {
  const std::span<msg::Provider* const> providers = msg::BuiltMessageProviders();
  for (TransportKind kind : s.config.transports) {
    for (msg::Provider* p : providers) {
      if (p->kind() != kind || p->BetweenHosts() != between_hosts) continue;
      char why[256] = "";
      const int n = p->Find(setup, s.physical, kMaxPhysicalDevices, why, sizeof(why));
      if (n > 0) return n;
      if (why[0]) SLIP_LOG(kInfo, "no %s devices: %s", TransportName(kind), why);
    }
  }
  return 0;
}

}  // namespace

State& S() noexcept {
  static State* state = new State();  // never destroyed: NCCL may call after exit starts
  return *state;
}

ncclResult_t ToNccl(msg::Status s) noexcept {
  using msg::Status;
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
  if (!ReadFaceVariables()) return ncclInvalidArgument;
  msg::FaceSetup setup;
  setup.config = &s.config;
  setup.log_level = level;
  setup.log_sink = g_logger.load(std::memory_order_relaxed) ? SinkToNccl : nullptr;
  setup.connect_timeout_ms = kConnectTimeoutMs;
  setup.flush_host_memory = g_flush_host;
  setup.queue_pairs = g_queue_pairs;
  // A network's devices when there are any: NCCL's network is for traffic between hosts.
  // Without one, a one-host transport (shm): ranks of one host made to look like several
  // (containers, NCCL_HOSTID), and every machine can run the plugin.
  s.physical_count = FindDevices(s, setup, /*between_hosts=*/true);
  if (s.physical_count == 0) s.physical_count = FindDevices(s, setup, /*between_hosts=*/false);
  if (s.physical_count == 0) {
    SLIP_LOG(kWarn, "no transport of SLIP_TRANSPORTS found a device: the plugin offers no network");
    return ncclInternalError;
  }
  for (int d = 0; d < s.physical_count; ++d) {
    VirtualDevice& v = s.vdevs[s.vdev_count++];
    v.props.ndevs = 1;
    v.props.devs[0] = d;
    snprintf(v.name, sizeof(v.name), "slipstream-%s", s.physical[d]->device().name);
  }
  const gpudirect::DriverInfo& cuda = gpudirect::Driver();
  if (cuda.loaded && cuda.devices > 0) {
    SLIP_LOG(kInfo, "CUDA driver %d, %d device(s), DMA-BUF %s", cuda.version, cuda.devices,
             cuda.dmabuf ? "supported" : "not supported");
  } else {
    SLIP_LOG(kInfo, "GPUDirect off: %s; host memory only (ptrSupport HOST)", cuda.why);
  }
  // What each device registers: NCCL stages GPU memory through host buffers where it is HOST.
  for (int d = 0; d < s.physical_count; ++d) {
    const int ptr = PtrSupportOf(s.physical[d]->device());
    SLIP_LOG(kInfo, "%s: ptrSupport %s", s.physical[d]->device().name,
             ptr & NCCL_PTR_DMABUF ? "HOST|CUDA|DMABUF"
             : ptr & NCCL_PTR_CUDA ? "HOST|CUDA"
                                   : "HOST");
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

}  // namespace slip::nccl
