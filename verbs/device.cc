#include "verbs/device.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>

#include "core/log.h"

namespace slip::verbs {

namespace {
constexpr size_t kMaxIdleSlots = 64;  // per device; beyond that slots are deregistered
}

size_t SlotBytes(uint32_t ring_size) noexcept {
  return 2 * size_t(ring_size) + kControlSize;
}

Device* Device::Open(ibv_context* context, int* error) noexcept {
  auto* dev = new (std::nothrow) Device();
  if (!dev) {
    *error = -ENOMEM;
    return nullptr;
  }
  dev->context_ = context;
  dev->pd_ = ibv_alloc_pd(context);
  dev->comp_channel_ = dev->pd_ ? ibv_create_comp_channel(context) : nullptr;
  if (!dev->comp_channel_) {
    *error = errno ? -errno : -ENOMEM;
    delete dev;
    return nullptr;
  }
  // The progress thread drains it until EAGAIN.
  int flags = fcntl(dev->comp_channel_->fd, F_GETFL);
  fcntl(dev->comp_channel_->fd, F_SETFL, flags | O_NONBLOCK);
  return dev;
}

Device::~Device() {
  for (const Slot& s : idle_) FreeSlot(s);
  if (comp_channel_) ibv_destroy_comp_channel(comp_channel_);
  if (pd_) ibv_dealloc_pd(pd_);
}

void Device::FreeSlot(const Slot& slot) noexcept {
  if (slot.local_mr) ibv_dereg_mr(slot.local_mr);
  if (slot.remote_mr) ibv_dereg_mr(slot.remote_mr);
  if (slot.base) munmap(slot.base, slot.size);
}

int Device::GetSlot(uint32_t ring_size, Slot* slot) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < idle_.size(); ++i) {
      if (idle_[i].ring_size != ring_size) continue;
      *slot = idle_[i];
      idle_[i] = idle_.back();
      idle_.pop_back();
      return 0;
    }
  }
  Slot s;
  s.ring_size = ring_size;
  s.size = SlotBytes(ring_size);
  void* p = mmap(nullptr, s.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -ENOMEM;
  // No MADV_DONTFORK: a forked child gets its own copy of the pinned pages (the kernel
  // copies pinned anonymous pages at fork), so its failed channels can still be read safely.
  s.base = static_cast<uint8_t*>(p);
  s.remote_mr = ibv_reg_mr(pd_, s.base, ring_size + kControlSize,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  int err = s.remote_mr ? 0 : errno;
  if (s.remote_mr) {
    s.local_mr = ibv_reg_mr(pd_, s.tx_mirror(), ring_size, IBV_ACCESS_LOCAL_WRITE);
    if (!s.local_mr) err = errno;
  }
  if (err || !s.local_mr) {
    FreeSlot(s);
    return -(err ? err : ENOMEM);
  }
  *slot = s;
  return 0;
}

void Device::PutSlot(const Slot& slot) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kMaxIdleSlots) {
      try {
        idle_.push_back(slot);
        return;
      } catch (...) {
      }
    }
  }
  FreeSlot(slot);
}

}  // namespace slip::verbs
