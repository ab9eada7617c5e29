#include "verbs/device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/sys.h"

namespace slip::verbs {

namespace {
constexpr size_t kMaxIdleSlots = 64;  // per device; beyond that slots are deregistered

// Registered slot bytes of the process, and the most it may hold (0: no limit of ours).
std::atomic<size_t> g_pinned{0};
std::atomic<size_t> g_pin_budget{0};

// Counts `bytes` as pinned if the budget has room for them.
bool ReservePinned(size_t bytes) noexcept {
  const size_t budget = g_pin_budget.load(std::memory_order_relaxed);
  size_t now = g_pinned.load(std::memory_order_relaxed);
  do {
    if (budget != 0 && (now > budget || bytes > budget - now)) return false;
  } while (!g_pinned.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  return true;
}
}  // namespace

void Device::SetPinBudget(size_t bytes) noexcept {
  g_pin_budget.store(bytes, std::memory_order_relaxed);
}

size_t Device::PinnedBytes() noexcept {
  return g_pinned.load(std::memory_order_relaxed);
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
  dev->comp_channel_ = ibv_create_comp_channel(context);
  if (!dev->comp_channel_) {
    *error = errno ? -errno : -ENOMEM;
    delete dev;
    return nullptr;
  }
  // One per device and process, out of the application's low numbers where there is room.
  dev->comp_channel_->fd = sys::MoveLibraryFdHigh(dev->comp_channel_->fd, sys::HiddenFdFloor());
  // The progress thread drains it until EAGAIN.
  int flags = fcntl(dev->comp_channel_->fd, F_GETFL);
  fcntl(dev->comp_channel_->fd, F_SETFL, flags | O_NONBLOCK);
  return dev;
}

Device::~Device() {
  for (const Slot& s : idle_) FreeSlot(s);
  if (comp_channel_) ibv_destroy_comp_channel(comp_channel_);
}

void Device::FreeSlot(const Slot& slot) noexcept {
  Slot s = slot;
  DeregisterSlot(&s);
  FreeRings(&s);
}

void Device::DeregisterSlot(Slot* slot) noexcept {
  if (slot->local_mr) ibv_dereg_mr(slot->local_mr);
  if (slot->remote_mr) ibv_dereg_mr(slot->remote_mr);
  if (slot->pd) {
    ibv_dealloc_pd(slot->pd);
    g_pinned.fetch_sub(slot->size, std::memory_order_relaxed);  // GetSlot counted it
  }
  slot->local_mr = nullptr;
  slot->remote_mr = nullptr;
  slot->pd = nullptr;
}

void Device::FreeRings(Slot* slot) noexcept {
  if (slot->base) munmap(slot->base, slot->size);
  slot->base = nullptr;
}

void RetireContext(ibv_context* context) noexcept {
  // librdmacm opened the context and closes it only when a later device list shows the
  // device gone (sync_devices_list), which it never does while no device is left (it
  // stops at an empty list): on a host whose only device was removed the context stays
  // open until exit, and a device that cannot disassociate user contexts (rxe) waits for
  // every one of its files to be closed before `rdma link delete` returns. Nothing of ours
  // uses the context any more (the caller destroyed our objects and rdma_cm ids on it), so
  // its two descriptors are replaced by /dev/null: the device's files are released now,
  // and librdmacm's own later use of the context (closing it, a protection domain of a
  // straggling id) fails harmlessly instead of touching another file. Read-only, so that a
  // command written there fails too (EBADF) rather than succeeding without an answer.
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    SLIP_LOG(kWarn, "verbs: cannot open /dev/null (%s): the removed device stays open",
             strerror(errno));
    return;
  }
  for (int fd : {context->async_fd, context->cmd_fd}) {
    if (fd >= 0 && fd != null_fd && sys::dup3(null_fd, fd, O_CLOEXEC) < 0)
      SLIP_LOG(kWarn, "verbs: cannot release descriptor %d of the removed device (%s)", fd,
               strerror(errno));
  }
  sys::close(null_fd);
}

bool ContextRetired(const ibv_context* context) noexcept {
  struct stat st {};
  return fstat(context->cmd_fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
}

int Device::GetSlot(uint32_t ring_size, Slot* slot) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The newest first: the oldest are the next to be given back.
    for (size_t i = idle_.size(); i-- > 0;) {
      if (idle_[i].ring_size != ring_size) continue;
      *slot = idle_[i];
      idle_.erase(idle_.begin() + long(i));
      return 0;
    }
  }
  Slot s;
  s.ring_size = ring_size;
  s.size = SlotBytes(ring_size);
  if (!ReservePinned(s.size)) return -ENOBUFS;
  void* p = mmap(nullptr, s.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    g_pinned.fetch_sub(s.size, std::memory_order_relaxed);
    return -ENOMEM;
  }
  // No MADV_DONTFORK: a forked child gets its own copy of the pinned pages (the kernel
  // copies pinned anonymous pages at fork), so its failed channels can still be read safely.
  s.base = static_cast<uint8_t*>(p);
  s.pd = ibv_alloc_pd(context_);
  int err = s.pd ? 0 : (errno ? errno : ENOMEM);
  if (s.pd) {
    s.remote_mr = ibv_reg_mr(s.pd, s.base, ring_size + kControlSize,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!s.remote_mr) err = errno;
  }
  if (s.remote_mr) {
    s.local_mr = ibv_reg_mr(s.pd, s.tx_mirror(), ring_size, IBV_ACCESS_LOCAL_WRITE);
    if (!s.local_mr) err = errno;
  }
  if (err || !s.local_mr) {
    if (!s.pd) g_pinned.fetch_sub(s.size, std::memory_order_relaxed);  // else FreeSlot does
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
        idle_.back().idle_since_ms = sys::MonotonicMs();
        return;
      } catch (...) {
      }
    }
  }
  FreeSlot(slot);
}

void Device::TrimIdle(uint64_t now_ms) noexcept {
  Slot expired[kMaxIdleSlots];
  size_t count = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Oldest first (PutSlot appends, GetSlot takes the newest).
    while (count < idle_.size() && now_ms - idle_[count].idle_since_ms >= kIdleSlotMs) {
      expired[count] = idle_[count];
      ++count;
    }
    idle_.erase(idle_.begin(), idle_.begin() + long(count));
  }
  for (size_t i = 0; i < count; ++i) FreeSlot(expired[i]);
}

}  // namespace slip::verbs
