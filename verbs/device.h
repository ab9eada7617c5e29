// One RDMA device as the transport uses it: a completion channel served by the progress
// thread, and a pool of registered ring slots.
//
// Removal (rdma_cm's DEVICE_REMOVAL: `rdma link delete`, a driver unload): the module stops
// handing the device out, its connections release what they hold of it (Conn::ReleaseRdma),
// and once none uses it (users() == 0) the module destroys it and retires the context
// (RetireContext), so that a device which cannot disassociate user contexts (rxe) can go
// while the process lives on.
//
// Slots are registered once and reused: a connection storm must not pay ibv_reg_mr (a
// page-pinning system call) per connection. Each slot holds the receive ring and a control
// block (one remotely writable region) and the send mirror (local only): the sender copies
// into the mirror at the same offsets it will write in the peer's ring, and RDMA WRITE
// takes the bytes from there. The mirror needs no separate free-space tracking: an offset
// is reused only after the peer returned credit for it, that is after the write landed.
//
// Isolation (docs/SECURITY.md, "Remote hosts"): every slot has a protection domain of its
// own, and a connection's queue pair is created in its slot's. A remote key is honoured
// only for a queue pair of the memory region's protection domain, so a peer reaches only
// the rings of the connection its queue pair belongs to, whatever addresses and keys it
// learned or guessed: another connection's queue pair, or one of its own earlier
// connections, is refused by the device (remote access error). A slot goes back to the
// pool only after its queue pair was destroyed, so the next connection's queue pair is
// again the only one in it, and the key it inherits reaches nothing else.
//
// Pinned memory is bounded: the process pins at most SLIP_VERBS_PIN_MAX bytes of slots
// (GetSlot says -ENOBUFS beyond), and idle slots are given back after kIdleSlotMs.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace slip::verbs {

// Control block layout, right after the receive ring (same memory region).
constexpr size_t kCreditInOffset = 0;     // u64: the peer writes our send credit here
constexpr size_t kCreditOutOffset = 64;   // u64: source of our credit writes when not inline
constexpr size_t kHelloOutOffset = 128;   // the HELLO we send (client)
constexpr size_t kParkedOutOffset = 160;  // our PARKED (reuse)
constexpr size_t kClaimOutOffset = 192;   // our CLAIM (client) or ANSWER (listener)
constexpr size_t kRecvBufOffset = 256;    // receive buffers for SENDs
constexpr size_t kRecvBufSize = 32;
constexpr uint32_t kRecvDepth = 128;
constexpr size_t kControlSize = 8192;
static_assert(kRecvBufOffset + kRecvDepth * kRecvBufSize <= kControlSize);
static_assert(kClaimOutOffset + kRecvBufSize <= kRecvBufOffset);

struct Slot {
  uint8_t* base = nullptr;  // rx ring, then the control block, then the tx mirror
  size_t size = 0;
  uint32_t ring_size = 0;
  ibv_pd* pd = nullptr;         // the slot's own: its connection's queue pair is made in it
  ibv_mr* remote_mr = nullptr;  // rx ring + control: remote write
  ibv_mr* local_mr = nullptr;   // tx mirror
  uint64_t idle_since_ms = 0;   // in the pool: when it went there

  uint8_t* rx_ring() const noexcept { return base; }
  uint8_t* control() const noexcept { return base + ring_size; }
  uint8_t* tx_mirror() const noexcept { return base + ring_size + kControlSize; }
};

class Device {
 public:
  // Takes a context owned by librdmacm (never closed here). Returns nullptr on failure.
  static Device* Open(ibv_context* context, int* error) noexcept;
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  ibv_context* context() const noexcept { return context_; }
  ibv_comp_channel* comp_channel() const noexcept { return comp_channel_; }
  const char* name() const noexcept { return ibv_get_device_name(context_->device); }
  // iWARP has no RDMA WRITE WITH IMMEDIATE.
  bool iwarp() const noexcept { return context_->device->transport_type == IBV_TRANSPORT_IWARP; }

  // A registered slot for rings of `ring_size`, with no queue pair in its protection
  // domain, or -errno: -ENOMEM when registration failed under a finite RLIMIT_MEMLOCK (the
  // caller says so and stays on TCP), -ENOBUFS when the process's pinned-memory budget
  // (SetPinBudget) has no room for it.
  int GetSlot(uint32_t ring_size, Slot* slot) noexcept;
  // Back to the pool; the queue pair made in the slot's protection domain must be
  // destroyed already.
  void PutSlot(const Slot& slot) noexcept;
  // Gives back the slots idle for longer than kIdleSlotMs (the progress thread, often).
  void TrimIdle(uint64_t now_ms) noexcept;
  // The slot's registrations and protection domain go (its queue pair must be destroyed
  // already), its memory stays (a connection that failed over to TCP still reads and
  // writes its rings); FreeRings unmaps it later.
  static void DeregisterSlot(Slot* slot) noexcept;
  static void FreeRings(Slot* slot) noexcept;

  // The most bytes of slots the process keeps registered (pinned), all devices together;
  // 0: no limit of our own (RLIMIT_MEMLOCK still applies). Set once, before any slot.
  static void SetPinBudget(size_t bytes) noexcept;
  // Bytes of slots registered now (in use and idle).
  static size_t PinnedBytes() noexcept;

  // Connections holding objects of this device (queue pair, completion queue, slot): the
  // device may be destroyed only once none does.
  void Use() noexcept { users_.fetch_add(1, std::memory_order_relaxed); }
  void Unuse() noexcept { users_.fetch_sub(1, std::memory_order_release); }
  int users() const noexcept { return users_.load(std::memory_order_acquire); }

 private:
  Device() = default;
  static void FreeSlot(const Slot& slot) noexcept;

  std::atomic<int> users_{0};
  ibv_context* context_ = nullptr;
  ibv_comp_channel* comp_channel_ = nullptr;
  std::mutex mu_;
  std::vector<Slot> idle_;  // registered, unused
};

// After its device was removed and every object of ours on it destroyed: lets the kernel
// finish the removal although librdmacm keeps `context` open (see device.cc).
void RetireContext(ibv_context* context) noexcept;
// True for a context that RetireContext retired (and librdmacm has not closed yet).
bool ContextRetired(const ibv_context* context) noexcept;

// Bytes one connection pins: what RLIMIT_MEMLOCK must allow per connection.
size_t SlotBytes(uint32_t ring_size) noexcept;

// How long a slot stays registered in the pool without a connection.
constexpr uint64_t kIdleSlotMs = 30000;

}  // namespace slip::verbs
