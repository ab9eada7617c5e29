// The NCCL face's memory registrations: host memory, and GPU memory (by address or as a
// DMA-BUF) where the device registers it.
#include <unistd.h>

#include <new>

#include "core/log.h"
#include "gpudirect/gpudirect.h"
#include "ncclnet-plugin/face.h"

namespace slip::nccl {

namespace {

using msg::Status;

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

}  // namespace slip::nccl
