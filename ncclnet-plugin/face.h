// What the NCCL face's files share (internal to ncclnet-plugin/): the comms NCCL holds,
// the devices it sees, and the face's state.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "core/config.h"
#include "core/msg_comm.h"
#include "ncclnet-plugin/net.h"

namespace slip::nccl {

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
inline msg::Comm* CommOf(FaceComm* face) noexcept {
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

inline msg::Memory* MemoryOf(void* mhandle) noexcept {
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

// The face's state: one per process, never destroyed (NCCL may call after exit starts).
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

State& S() noexcept;

// Status to NCCL's result (kAgain is success: NCCL calls again).
ncclResult_t ToNccl(msg::Status s) noexcept;
// The transport under virtual device `dev` (its first: merged devices are not striped).
msg::Transport* TransportOf(int dev) noexcept;
// What a device registers: NCCL_PTR_HOST, and CUDA and DMABUF where it and the driver can.
int PtrSupportOf(const msg::DeviceInfo& info) noexcept;
// Whether `comm` is one NCCL holds now.
bool IsLive(const void* comm) noexcept;

}  // namespace slip::nccl
