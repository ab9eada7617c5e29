// The verbs module: start-up, devices, fork, and the library's entry point.
// (module_impl.h says which file holds what.)
#include <fcntl.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <new>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/module_impl.h"

namespace slip::verbs {

using namespace module_internal;

int VerbsModule::Init(char* error, size_t error_len) noexcept {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  int usable = 0;
  for (int i = 0; list && i < count; ++i) {
    if (options_->device.empty() || options_->device == ibv_get_device_name(list[i])) ++usable;
  }
  if (list) ibv_free_device_list(list);
  if (usable == 0) {
    snprintf(error, error_len,
             options_->device.empty() ? "no RDMA device" : "RDMA device %s not found",
             options_->device.c_str());
    return -ENODEV;
  }
  cm_channel_ = rdma_create_event_channel();
  if (cm_channel_) cm_channel_->fd = sys::MoveLibraryFdHigh(cm_channel_->fd, sys::HiddenFdFloor());
  if (!cm_channel_ || !SetNonblocking(cm_channel_->fd)) {
    snprintf(error, error_len, "cannot open the rdma_cm event channel (%s)", strerror(errno));
    return -ENODEV;
  }
  epoll_fd_ = sys::MoveHigh(epoll_create1(EPOLL_CLOEXEC), sys::HiddenFdFloor());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // null: the rdma_cm channel; otherwise a Device
  if (epoll_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, cm_channel_->fd, &ev) != 0) {
    snprintf(error, error_len, "epoll: %s", strerror(errno));
    return -EIO;
  }
  SetConnWatchEpoll(epoll_fd_);  // connections' own completion channels (odd keys)
  // The pinned-memory budget: what the user set, or a quarter of physical memory (a peer
  // that asks for connections must not pin what the host needs, RLIMIT_MEMLOCK or not).
  uint64_t budget = options_->pin_max;
  if (budget == 0) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    budget = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) / 4 : 0;
  }
  Device::SetPinBudget(size_t(budget));
  // Rings must be pinned: say once, clearly, when the limit cannot hold even one.
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur < SlotBytes(config_->ring_size) && geteuid() != 0) {
    SLIP_LOG(kWarn,
             "verbs: RLIMIT_MEMLOCK is %lu KiB but one connection pins %zu KiB; verbs "
             "connections will stay on TCP (raise it: ulimit -l, or limits.conf memlock)",
             (unsigned long)(rl.rlim_cur / 1024), SlotBytes(config_->ring_size) / 1024);
    memlock_reported_ = true;
  }
  try {
    thread_ = std::thread([this] { Run(); });
    thread_.detach();
  } catch (...) {
    snprintf(error, error_len, "cannot start the progress thread");
    return -EAGAIN;
  }
  return 0;
}

Device* VerbsModule::DeviceFor(ibv_context* context, int* error) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = devices_.find(context);
  if (it != devices_.end()) return it->second;
  for (Removal& r : removals_) {
    if (r.context != context || r.superseded) continue;
    if (r.retired && !ContextRetired(context)) {
      // librdmacm closed the retired context and opened a new one at the same address
      // (the device came back).
      r.superseded = true;
      break;
    }
    *error = -ENODEV;  // removed: an id resolved before it went still names it
    if (r.retired) {
      // The device may have come back under the same GUID, which librdmacm matched to its
      // old entry: a fresh look at the device list marks that entry dead, so the next id
      // binds to the new device (this one stays plain).
      if (ibv_context** list = rdma_get_devices(nullptr)) rdma_free_devices(list);
    }
    return nullptr;
  }
  Device* dev = Device::Open(context, error);
  if (!dev) return nullptr;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = dev;
  try {
    devices_[context] = dev;
  } catch (...) {
    delete dev;
    *error = -ENOMEM;
    return nullptr;
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, dev->comp_channel()->fd, &ev);
  return dev;
}

bool VerbsModule::DeviceAllowed(ibv_context* context) const noexcept {
  return context &&
         (options_->device.empty() || options_->device == ibv_get_device_name(context->device));
}

bool VerbsModule::SendNotify(Device* device) const noexcept {
  if (options_->notify == NotifyMode::kSend) return true;
  if (options_->notify == NotifyMode::kImm) return false;
  return device->iwarp();
}

Reason VerbsModule::MemlockReason(int error, uint32_t ring_size) noexcept {
  if (error == -ENOBUFS) {
    SLIP_LOG(kWarn,
             "verbs: %zu KiB of rings already pinned, the budget (SLIP_VERBS_PIN_MAX) has no "
             "room for %zu KiB more: this connection stays on TCP",
             Device::PinnedBytes() / 1024, SlotBytes(ring_size) / 1024);
    return Reason::kResources;
  }
  rlimit rl{};
  bool limited = getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
  if (error != -ENOMEM && error != -EPERM && error != -EAGAIN) return Reason::kResources;
  if (!limited) return Reason::kResources;
  if (!memlock_reported_.exchange(true))
    SLIP_LOG(kWarn,
             "verbs: cannot register %zu KiB of rings: RLIMIT_MEMLOCK is %lu KiB; this and "
             "further verbs connections stay on TCP (raise it: ulimit -l)",
             SlotBytes(ring_size) / 1024, (unsigned long)(rl.rlim_cur / 1024));
  return Reason::kMemlock;
}

}  // namespace slip::verbs

extern "C" __attribute__((visibility("default"))) slip::verbs::Module* slip_verbs_module(
    const slip::Config* config, const slip::verbs::Options* options, int hidden_fd_floor,
    slip::OwnFdTable* own_fds, char* error, size_t error_len) {
  static std::mutex mu;
  static slip::verbs::VerbsModule* module = nullptr;
  static bool tried = false;
  std::lock_guard<std::mutex> lock(mu);
  if (tried) {
    if (!module) snprintf(error, error_len, "unavailable (see the first message)");
    return module;
  }
  tried = true;
  slip::sys::SetHiddenFdFloor(hidden_fd_floor);
  slip::UseOwnFds(own_fds);
  slip::LogInit(config->log_level, config->log_file.c_str());
  auto* m = new (std::nothrow) slip::verbs::VerbsModule(config, options);
  if (!m) {
    snprintf(error, error_len, "out of memory");
    return nullptr;
  }
  if (m->Init(error, error_len) < 0) return nullptr;  // half-started: kept, never used
  module = m;
  return module;
}
