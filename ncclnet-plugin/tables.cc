// The exported tables, one per ABI version NCCL may look up (newest first: v11 for NCCL
// 2.28). Each entry adapts its version's signature to net.h; nothing else is exported
// (libnccl-net-slipstream.map).
#include <climits>
#include <new>

#include "ncclnet-plugin/nccl_abi.h"
#include "ncclnet-plugin/net.h"

#define SLIP_EXPORT extern "C" __attribute__((visibility("default")))

namespace slip::nccl {
namespace {

template <typename P>
void CopyCommon(const Properties& p, P* out) noexcept {
  out->name = const_cast<char*>(p.name);
  out->pciPath = const_cast<char*>(p.pci_path);
  out->guid = p.guid;
  out->ptrSupport = p.ptr_support;
  out->regIsGlobal = p.reg_is_global;
  out->speed = p.speed_mbps;
  out->port = p.port;
  out->latency = p.latency_us;
  out->maxComms = p.max_comms;
  out->maxRecvs = p.max_recvs;
  out->netDeviceType = NCCL_NET_DEVICE_HOST;
  out->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
}

template <typename P>
void CopyV9(const Properties& p, P* out) noexcept {
  CopyCommon(p, out);
  out->forceFlush = p.force_flush;
  out->vProps = p.vprops;
  out->maxP2pBytes = p.max_p2p_bytes;
  out->maxCollBytes = p.max_coll_bytes;
}

ncclResult_t GetPropertiesV8(int dev, ncclNetProperties_v8_t* props) noexcept {
  Properties p;
  if (ncclResult_t rc = GetProperties(dev, &p); rc != ncclSuccess) return rc;
  CopyCommon(p, props);
  return ncclSuccess;
}

ncclResult_t GetPropertiesV9(int dev, ncclNetProperties_v9_t* props) noexcept {
  Properties p;
  if (ncclResult_t rc = GetProperties(dev, &p); rc != ncclSuccess) return rc;
  CopyV9(p, props);
  return ncclSuccess;
}

ncclResult_t GetPropertiesV11(int dev, ncclNetProperties_v11_t* props) noexcept {
  Properties p;
  if (ncclResult_t rc = GetProperties(dev, &p); rc != ncclSuccess) return rc;
  CopyV9(p, &props->v9);
  props->maxMultiRequestSize = 1;
  return ncclSuccess;
}

ncclResult_t InitV8(ncclDebugLogger_t logger) noexcept {
  return Init(logger);
}
ncclResult_t InitV10(ncclDebugLogger_t logger, ncclProfilerCallback_t) noexcept {
  return Init(logger);
}

// v11: NCCL makes a context per communicator; ours holds nothing yet (the traffic class
// has no meaning on shm), but it is real memory that finalize frees.
struct Context {
  static constexpr uint32_t kMagic = 0x534c4358;  // "SLCX"
  uint32_t magic = kMagic;
};
ncclResult_t InitV11(void** ctx, uint64_t, ncclNetCommConfig_v10_t*, ncclDebugLogger_t logger,
                     ncclProfilerCallback_t) noexcept {
  if (ctx == nullptr) return ncclInvalidArgument;
  if (ncclResult_t rc = Init(logger); rc != ncclSuccess) return rc;
  auto* c = new (std::nothrow) Context();
  if (c == nullptr) return ncclSystemError;
  *ctx = c;
  return ncclSuccess;
}
ncclResult_t FinalizeV11(void* ctx) noexcept {
  auto* c = static_cast<Context*>(ctx);
  if (c == nullptr || c->magic != Context::kMagic) return ncclInvalidArgument;
  c->magic = 0;
  delete c;
  return ncclSuccess;
}
ncclResult_t SetNetAttrV11(void*, ncclNetAttr_v11_t*) noexcept {
  return ncclSuccess;
}

ncclResult_t ListenV11(void*, int dev, void* handle, void** listen_comm) noexcept {
  return Listen(dev, handle, listen_comm);
}
ncclResult_t ConnectV8(int dev, void* handle, void** send_comm,
                       ncclNetDeviceHandle_v8_t** dev_comm) noexcept {
  return Connect(dev, handle, send_comm, dev_comm);
}
ncclResult_t ConnectV10(int dev, ncclNetCommConfig_v10_t*, void* handle, void** send_comm,
                        ncclNetDeviceHandle_v8_t** dev_comm) noexcept {
  return Connect(dev, handle, send_comm, dev_comm);
}
ncclResult_t ConnectV11(void*, int dev, void* handle, void** send_comm,
                        ncclNetDeviceHandle_v8_t** dev_comm) noexcept {
  return Connect(dev, handle, send_comm, dev_comm);
}

ncclResult_t IsendV8(void* comm, void* data, int size, int tag, void* mh, void** req) noexcept {
  if (size < 0) return ncclInvalidArgument;
  return Isend(comm, data, size_t(size), tag, mh, req);
}
ncclResult_t IsendV9(void* comm, void* data, size_t size, int tag, void* mh, void** req) noexcept {
  return Isend(comm, data, size, tag, mh, req);
}
ncclResult_t IsendV10(void* comm, void* data, size_t size, int tag, void* mh, void*,
                      void** req) noexcept {
  return Isend(comm, data, size, tag, mh, req);
}

ncclResult_t IrecvV8(void* comm, int n, void** data, int* sizes, int* tags, void** mh,
                     void** req) noexcept {
  if (n < 1 || n > NCCL_NET_MAX_REQUESTS || sizes == nullptr) return ncclInvalidArgument;
  size_t wide[NCCL_NET_MAX_REQUESTS];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) return ncclInvalidArgument;
    wide[i] = size_t(sizes[i]);
  }
  return Irecv(comm, n, data, wide, tags, mh, req);
}
ncclResult_t IrecvV9(void* comm, int n, void** data, size_t* sizes, int* tags, void** mh,
                     void** req) noexcept {
  return Irecv(comm, n, data, sizes, tags, mh, req);
}
ncclResult_t IrecvV10(void* comm, int n, void** data, size_t* sizes, int* tags, void** mh, void**,
                      void** req) noexcept {
  return Irecv(comm, n, data, sizes, tags, mh, req);
}

}  // namespace
}  // namespace slip::nccl

using namespace slip::nccl;

SLIP_EXPORT const ncclNet_v11_t ncclNetPlugin_v11 = {
    kPluginName, InitV11,     Devices,     GetPropertiesV11, ListenV11,   ConnectV11,
    Accept,      RegMr,       RegMrDmaBuf, DeregMr,          IsendV10,    IrecvV10,
    Iflush,      Test,        CloseSend,   CloseRecv,        CloseListen, nullptr,
    nullptr,     MakeVDevice, FinalizeV11, SetNetAttrV11,
};

SLIP_EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
    kPluginName, InitV10,     Devices,     GetPropertiesV9, Listen,   ConnectV10,  Accept,
    RegMr,       RegMrDmaBuf, DeregMr,     IsendV10,        IrecvV10, Iflush,      Test,
    CloseSend,   CloseRecv,   CloseListen, nullptr,         nullptr,  MakeVDevice,
};

SLIP_EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    kPluginName, InitV8,      Devices,     GetPropertiesV9, Listen,  ConnectV8,   Accept,
    RegMr,       RegMrDmaBuf, DeregMr,     IsendV9,         IrecvV9, Iflush,      Test,
    CloseSend,   CloseRecv,   CloseListen, nullptr,         nullptr, MakeVDevice,
};

SLIP_EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
    kPluginName, InitV8,      Devices,     GetPropertiesV8, Listen,  ConnectV8, Accept,
    RegMr,       RegMrDmaBuf, DeregMr,     IsendV8,         IrecvV8, Iflush,    Test,
    CloseSend,   CloseRecv,   CloseListen, nullptr,         nullptr,
};
