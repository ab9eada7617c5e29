// shm's message comms: the data path (shm/msg.h). No allocation, no lock, no system call
// while bytes move; a system call only to look whether a silent peer is still there.
#include <sys/mman.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sys.h"
#include "shm/msg_internal.h"
#include "shm/msg_wire.h"
#include "shm/region.h"

namespace slip::shm {

namespace {

using msg::Status;
using msgwire::CtsRecord;
using msgwire::FrameHeader;

// A sender publishes at most this much at once, so that the receiver copies out one
// chunk while the next goes in (writes of the ring's size otherwise alternate).
constexpr uint64_t kChunk = 128 << 10;
// A comm that makes no progress looks at its socket this often (a peer that died).
constexpr uint64_t kLivenessEveryNs = 2'000'000;

// What both ends share: the region, the socket, the peer's liveness.
class CommBase {
 protected:
  CommBase(void* region, uint32_t ring_size, int sock) noexcept
      : region_(static_cast<uint8_t*>(region)),
        control_(static_cast<RegionControl*>(region)),
        ring_size_(ring_size),
        mask_(ring_size - 1),
        cts_window_(msgwire::CtsWindow(ring_size)),
        sock_(sock) {}
  ~CommBase() {
    munmap(region_, RegionSize(ring_size_));
    sys::close(sock_);
  }

  uint8_t* forward_ring() const noexcept { return region_ + kControlPage; }
  uint8_t* reverse_ring() const noexcept { return region_ + kControlPage + ring_size_; }

  // Whether the peer closed its end (or died), looked at no more often than
  // kLivenessEveryNs.
  bool PeerGone() noexcept {
    const uint64_t now = sys::MonotonicNs();
    if (now - last_look_ns_ < kLivenessEveryNs) return false;
    last_look_ns_ = now;
    char byte;
    const ssize_t n = sys::recv(sock_, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  Status Fail(Status status) noexcept {
    if (error_ == Status::kOk) error_ = status;
    return error_;
  }

  uint8_t* region_;
  RegionControl* control_;
  const uint32_t ring_size_;
  const uint32_t mask_;
  const uint64_t cts_window_;  // where clear-to-send records go round (msg_wire.h)
  const int sock_;
  uint64_t last_look_ns_ = 0;
  Status error_ = Status::kOk;
};

// Copies into a receive buffer front to back, 16 bytes at a time, each store issued after
// the one before: NCCL's LL and LL128 protocols poll flags inside the data (LL128: the last
// 8 bytes of each 128-byte line), so a flag must never become visible before the bytes it
// covers. memcpy makes no such promise (glibc's stores the first vector of a copy last, and
// large copies with non-temporal stores): measured on an H200 with NCCL_PROTO=LL128 forced,
// broadcasts of 16 and 256 MiB came out wrong through the plugin with memcpy, exact with
// this. (x86 keeps stores in program order; elsewhere a release fence per 128 bytes does.)
void CopyInOrder(uint8_t* dst, const uint8_t* src, size_t n) noexcept {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint8_t v[16];
    std::memcpy(v, src + i, 16);
    std::memcpy(dst + i, v, 16);
    asm volatile("" ::: "memory");  // the compiler keeps the stores in this order
#if !defined(__x86_64__)
    if ((i & 127) == 112) std::atomic_thread_fence(std::memory_order_release);
#endif
  }
  for (; i < n; ++i) {
    dst[i] = src[i];
    asm volatile("" ::: "memory");
  }
#if !defined(__x86_64__)
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

// ------------------------------------------------------------------------- sender

class ShmSendComm;

class SendRequest final : public msg::Request {
 public:
  Status Test(bool* done, size_t* sizes, int* count) noexcept override;

  ShmSendComm* comm = nullptr;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  uint32_t seq = 0;
  uint16_t index = 0;
  uint64_t written = 0;  // frame bytes in the ring (header, payload, padding)
  bool in_use = false;   // the caller holds it
  bool queued = false;   // its frame is not all in the ring yet
};

class ShmSendComm final : public msg::SendComm, private CommBase {
 public:
  ShmSendComm(void* region, uint32_t ring_size, int sock) noexcept
      : CommBase(region, ring_size, sock) {
    for (auto& r : requests_) r.comm = this;
  }

  Status Send(const void* data, size_t size, int tag, msg::Memory* /*copied by the CPU*/,
              msg::Request** out) noexcept override {
    *out = nullptr;
    if (error_ != Status::kOk) return error_;
    if (Status s = PullCts(); s != Status::kOk) return s;
    if (posted_count_ == 0) return LivenessOr(Status::kAgain);
    Posted& slot = posted_[posted_head_];
    int index = -1;
    for (int i = 0; i < slot.count; ++i) {
      if (!(slot.matched & (1u << i)) && slot.tags[i] == tag) {
        index = i;
        break;
      }
    }
    if (index < 0) return Status::kAgain;  // a send of the group for another tag first
    if (size > slot.capacities[index]) {
      SLIP_LOG(kWarn,
               "NCCL send of %zu bytes (tag %d) to a receive of %llu bytes: refused (the "
               "receiver posted less than the sender sends)",
               size, tag, (unsigned long long)slot.capacities[index]);
      return Status::kBadArgument;
    }
    SendRequest* r = FreeRequest();
    if (r == nullptr) return Status::kAgain;
    r->data = static_cast<const uint8_t*>(data);
    r->size = size;
    r->seq = slot.seq;
    r->index = uint16_t(index);
    r->written = 0;
    r->in_use = r->queued = true;
    fifo_[(fifo_head_ + fifo_count_) % msg::kMaxRequests] = r;
    ++fifo_count_;
    slot.matched |= 1u << index;
    if (slot.matched == (1u << slot.count) - 1) {
      posted_head_ = (posted_head_ + 1) % msg::kMaxRequests;
      --posted_count_;
    }
    Push();  // the first chunk now: a small message is on its way before the first test
    *out = r;
    return Status::kOk;
  }

  Status TestSend(SendRequest* r, bool* done, size_t* sizes, int* count) noexcept {
    *done = false;
    if (!r->in_use) return Status::kBadArgument;
    if (r->queued && error_ == Status::kOk) {
      Push();
      PullCts();
    }
    if (r->queued) {
      if (error_ == Status::kOk && PeerGone()) {
        SLIP_LOG(kWarn,
                 "NCCL comm over shm: the receiver closed its end (or died) before a send of "
                 "%llu bytes was all written",
                 (unsigned long long)r->size);
        Fail(Status::kRemote);
      }
      if (error_ != Status::kOk) {
        r->in_use = false;  // the request fails with its comm and is not tested again
        return error_;
      }
      return Status::kOk;
    }
    *done = true;
    sizes[0] = r->size;
    *count = 1;
    r->in_use = false;
    return Status::kOk;
  }

 private:
  struct Posted {  // a receive's clear-to-send, copied out of the ring and checked
    uint32_t seq;
    int count;
    uint32_t matched;
    int tags[msg::kMaxGroup];
    uint64_t capacities[msg::kMaxGroup];
  };

  Status LivenessOr(Status status) noexcept {
    if (PeerGone()) {
      SLIP_LOG(kWarn, "NCCL comm over shm: the receiver closed its end (or died)");
      return Fail(Status::kRemote);
    }
    return status;
  }

  SendRequest* FreeRequest() noexcept {
    for (auto& r : requests_)
      if (!r.in_use && !r.queued) return &r;
    return nullptr;
  }

  // Takes the receiver's new clear-to-send records.
  Status PullCts() noexcept {
    DirectionControl& d = control_->to_client;
    const uint64_t produced = d.produced.load(std::memory_order_acquire);
    if (produced - cts_consumed_ > cts_window_ || produced < cts_consumed_)
      return Violation("its clear-to-send cursor is out of range");
    bool took = false;
    while (produced - cts_consumed_ >= msgwire::kCtsBytes && posted_count_ < msg::kMaxRequests) {
      CtsRecord r;
      std::memcpy(&r, reverse_ring() + (cts_consumed_ % cts_window_), sizeof(r));
      if (!msgwire::ValidCts(r, next_cts_seq_, UINT64_MAX / 2))
        return Violation("a clear-to-send record is malformed");
      Posted& p = posted_[(posted_head_ + posted_count_) % msg::kMaxRequests];
      p.seq = r.seq;
      p.count = r.count;
      p.matched = 0;
      for (int i = 0; i < r.count; ++i) {
        p.tags[i] = r.entries[i].tag;
        p.capacities[i] = r.entries[i].capacity;
      }
      ++posted_count_;
      ++next_cts_seq_;
      cts_consumed_ += msgwire::kCtsBytes;
      took = true;
    }
    if (took) d.consumed.store(cts_consumed_, std::memory_order_release);
    return Status::kOk;
  }

  Status Violation(const char* what) noexcept {
    SLIP_LOG(kWarn, "NCCL comm over shm: the receiver broke the protocol (%s): comm failed", what);
    return Fail(Status::kRemote);
  }

  // Writes queued frames into the forward ring as far as credits allow.
  void Push() noexcept {
    DirectionControl& d = control_->to_server;
    const uint64_t consumed = d.consumed.load(std::memory_order_acquire);
    if (consumed > produced_ || produced_ - consumed > ring_size_) {
      Violation("its credit cursor is out of range");
      return;
    }
    uint64_t room = ring_size_ - (produced_ - consumed);
    const uint64_t start = produced_;
    while (fifo_count_ > 0 && room > 0) {
      SendRequest* r = fifo_[fifo_head_];
      const uint64_t frame = msgwire::FrameBytes(r->size);
      if (r->written == 0) {
        if (room < sizeof(FrameHeader)) break;
        const FrameHeader h{r->seq, r->index, 0, r->size};
        std::memcpy(forward_ring() + (produced_ & mask_), &h, sizeof(h));
        produced_ += sizeof(h);
        room -= sizeof(h);
        r->written = sizeof(h);
      }
      // Payload, then padding, never past the ring's end in one copy.
      while (r->written < frame && room > 0) {
        const uint64_t payload_done = r->written - sizeof(FrameHeader);
        uint64_t n;
        if (payload_done < r->size) {
          const uint64_t offset = produced_ & mask_;
          n = std::min({r->size - payload_done, room, uint64_t(ring_size_) - offset, kChunk});
          std::memcpy(forward_ring() + offset, r->data + payload_done, n);
        } else {
          n = std::min(frame - r->written, room);  // padding: nothing to copy
        }
        produced_ += n;
        room -= n;
        r->written += n;
        if (produced_ - start >= kChunk) Publish();
      }
      if (r->written < frame) break;
      r->queued = false;
      fifo_head_ = (fifo_head_ + 1) % msg::kMaxRequests;
      --fifo_count_;
    }
    Publish();
  }

  void Publish() noexcept {
    control_->to_server.produced.store(produced_, std::memory_order_release);
  }

  SendRequest requests_[msg::kMaxRequests];
  SendRequest* fifo_[msg::kMaxRequests] = {};  // sends whose frames are not all written
  int fifo_head_ = 0, fifo_count_ = 0;
  Posted posted_[msg::kMaxRequests];  // receives not matched by sends yet, oldest first
  int posted_head_ = 0, posted_count_ = 0;
  uint32_t next_cts_seq_ = 0;
  uint64_t cts_consumed_ = 0;  // ours: never read back from the region
  uint64_t produced_ = 0;      // likewise
};

Status SendRequest::Test(bool* done, size_t* sizes, int* count) noexcept {
  return comm->TestSend(this, done, sizes, count);
}

// ----------------------------------------------------------------------- receiver

class ShmRecvComm;

class RecvRequest final : public msg::Request {
 public:
  Status Test(bool* done, size_t* sizes, int* count) noexcept override;

  ShmRecvComm* comm = nullptr;
  uint32_t seq = 0;
  int count = 0;
  uint8_t* data[msg::kMaxGroup] = {};
  uint64_t capacities[msg::kMaxGroup] = {};
  uint64_t received[msg::kMaxGroup] = {};
  uint32_t done_mask = 0;
  bool in_use = false;  // the caller holds it
  bool queued = false;  // frames still to come
};

class ShmRecvComm final : public msg::RecvComm, private CommBase {
 public:
  ShmRecvComm(void* region, uint32_t ring_size, int sock) noexcept
      : CommBase(region, ring_size, sock) {
    for (auto& r : requests_) r.comm = this;
  }

  Status Recv(int n, void* const* data, const size_t* sizes, const int* tags,
              msg::Memory* const* /*copied by the CPU*/, msg::Request** out) noexcept override {
    *out = nullptr;
    if (error_ != Status::kOk) return error_;
    if (n < 1 || n > msg::kMaxGroup) return Status::kBadArgument;
    RecvRequest* r = FreeRequest();
    if (r == nullptr) return Status::kAgain;
    // The reverse ring: our clear-to-send records, credited by the sender.
    DirectionControl& d = control_->to_client;
    const uint64_t consumed = d.consumed.load(std::memory_order_acquire);
    if (consumed > cts_produced_ || cts_produced_ - consumed > cts_window_) {
      Violation("its clear-to-send credit is out of range");
      return error_;
    }
    if (cts_window_ - (cts_produced_ - consumed) < msgwire::kCtsBytes) return Status::kAgain;
    CtsRecord record{};
    record.seq = next_seq_;
    record.count = uint16_t(n);
    r->seq = next_seq_;
    r->count = n;
    r->done_mask = 0;
    for (int i = 0; i < n; ++i) {
      record.entries[i].tag = tags[i];
      record.entries[i].capacity = sizes[i];
      r->data[i] = static_cast<uint8_t*>(data[i]);
      r->capacities[i] = sizes[i];
      r->received[i] = 0;
    }
    std::memcpy(reverse_ring() + (cts_produced_ % cts_window_), &record, sizeof(record));
    cts_produced_ += msgwire::kCtsBytes;
    d.produced.store(cts_produced_, std::memory_order_release);
    ++next_seq_;
    r->in_use = r->queued = true;
    fifo_[(fifo_head_ + fifo_count_) % msg::kMaxRequests] = r;
    ++fifo_count_;
    *out = r;
    return Status::kOk;
  }

  Status TestRecv(RecvRequest* r, bool* done, size_t* sizes, int* count) noexcept {
    *done = false;
    if (!r->in_use) return Status::kBadArgument;
    if (r->queued && error_ == Status::kOk && !Pull() && r->queued && error_ == Status::kOk &&
        PeerGone()) {
      // Gone: whatever it published before it went is in the ring already.
      Pull();
      if (r->queued && error_ == Status::kOk) {
        SLIP_LOG(kWarn,
                 "NCCL comm over shm: the sender closed its end (or died) before receive "
                 "#%u was complete",
                 unsigned(r->seq));
        Fail(Status::kRemote);
      }
    }
    if (r->queued) {
      if (error_ != Status::kOk) {
        r->in_use = false;
        return error_;
      }
      return Status::kOk;
    }
    *done = true;
    for (int i = 0; i < r->count; ++i) sizes[i] = r->received[i];
    *count = r->count;
    r->in_use = false;
    return Status::kOk;
  }

 private:
  RecvRequest* FreeRequest() noexcept {
    for (auto& r : requests_)
      if (!r.in_use && !r.queued) return &r;
    return nullptr;
  }

  bool Violation(const char* what) noexcept {
    SLIP_LOG(kWarn, "NCCL comm over shm: the sender broke the protocol (%s): comm failed", what);
    Fail(Status::kRemote);
    return false;
  }

  // Copies what the sender published into the posted buffers, crediting as it goes.
  // True when it moved anything.
  bool Pull() noexcept {
    DirectionControl& d = control_->to_server;
    const uint64_t produced = d.produced.load(std::memory_order_acquire);
    if (produced < consumed_ || produced - consumed_ > ring_size_)
      return Violation("its cursor is out of range");
    const uint64_t start = consumed_;
    while (consumed_ < produced && error_ == Status::kOk) {
      if (!in_frame_) {
        if (produced - consumed_ < sizeof(FrameHeader)) break;
        FrameHeader h;
        std::memcpy(&h, forward_ring() + (consumed_ & mask_), sizeof(h));
        if (fifo_count_ == 0) return Violation("a frame for no posted receive");
        RecvRequest* r = fifo_[fifo_head_];
        if (h.seq != r->seq || h.index >= r->count || (r->done_mask & (1u << h.index)) ||
            h.size > r->capacities[h.index] || h.reserved != 0)
          return Violation("a frame that matches no posted buffer");
        consumed_ += sizeof(h);
        in_frame_ = true;
        frame_ = h;
        frame_done_ = 0;
        frame_pad_ = msgwire::FrameBytes(h.size) - sizeof(h) - h.size;
      }
      RecvRequest* r = fifo_[fifo_head_];
      while (frame_done_ < frame_.size && consumed_ < produced) {
        const uint64_t offset = consumed_ & mask_;
        const uint64_t n = std::min(
            {frame_.size - frame_done_, produced - consumed_, uint64_t(ring_size_) - offset});
        CopyInOrder(r->data[frame_.index] + frame_done_, forward_ring() + offset, n);
        frame_done_ += n;
        consumed_ += n;
        if (consumed_ - start >= kChunk) Credit();
      }
      if (frame_done_ < frame_.size || produced - consumed_ < frame_pad_) break;
      consumed_ += frame_pad_;
      in_frame_ = false;
      r->received[frame_.index] = frame_.size;
      r->done_mask |= 1u << frame_.index;
      if (r->done_mask == (1u << r->count) - 1) {
        r->queued = false;
        fifo_head_ = (fifo_head_ + 1) % msg::kMaxRequests;
        --fifo_count_;
      }
    }
    if (consumed_ != start) Credit();
    return consumed_ != start;
  }

  void Credit() noexcept {
    control_->to_server.consumed.store(consumed_, std::memory_order_release);
  }

  RecvRequest requests_[msg::kMaxRequests];
  RecvRequest* fifo_[msg::kMaxRequests] = {};  // receives with frames to come, oldest first
  int fifo_head_ = 0, fifo_count_ = 0;
  uint32_t next_seq_ = 0;
  uint64_t cts_produced_ = 0;  // ours: never read back from the region
  uint64_t consumed_ = 0;      // likewise
  bool in_frame_ = false;
  FrameHeader frame_{};  // the frame being copied (checked)
  uint64_t frame_done_ = 0;
  uint64_t frame_pad_ = 0;
};

Status RecvRequest::Test(bool* done, size_t* sizes, int* count) noexcept {
  return comm->TestRecv(this, done, sizes, count);
}

}  // namespace

std::unique_ptr<msg::SendComm> MakeSendComm(void* region, uint32_t ring_size, int sock) noexcept {
  return std::unique_ptr<msg::SendComm>(new (std::nothrow) ShmSendComm(region, ring_size, sock));
}

std::unique_ptr<msg::RecvComm> MakeRecvComm(void* region, uint32_t ring_size, int sock) noexcept {
  return std::unique_ptr<msg::RecvComm>(new (std::nothrow) ShmRecvComm(region, ring_size, sock));
}

}  // namespace slip::shm
