// verbs' message comms, inside the module: the objects behind verbs/msg.h.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/msg_comm.h"
#include "core/msg_module.h"
#include "verbs/msg.h"
#include "verbs/msg_wire.h"

namespace slip::verbs::msgimpl {

using msg::Status;

// One RDMA device as the NCCL face sees it.
struct Device {
  ibv_context* context = nullptr;  // librdmacm's (never closed here)
  uint8_t port = 1;
  sockaddr_storage address{};  // where its listeners listen (port 0)
  msg::DeviceInfo info;
};

// A registration of the caller's buffer with one comm's protection domain.
class VerbsMemory final : public msg::Memory {
 public:
  static constexpr uint32_t kMagic = 0x524d5653;  // "SVMR"
  uint32_t magic = kMagic;
  const void* owner = nullptr;  // the Endpoint
  ibv_mr* mr = nullptr;
  uintptr_t begin = 0, end = 0;
  bool device = false;  // GPU memory: a receive into it is flushed (Endpoint::PostFlush)
  bool Covers(const void* data, size_t size) const noexcept {
    const uintptr_t p = uintptr_t(data);
    return p >= begin && p <= end && size <= end - p;
  }
};

// One end's verbs objects: rdma_cm id and its event channel, protection domain,
// completion queue, queue pair, the comm's own control memory (registered), and the
// caller's registrations. Destroyed in the reverse order they were made.
class Endpoint {
 public:
  // Control memory: the sender's CTS FIFO then the size words it sends from; the
  // receiver's size slots (written by its sender) then the CTS entries it writes from.
  static constexpr size_t kSizeSlotsBytes = msg::kMaxRequests * msg::kMaxGroup * 4;
  // Then where flushes read into.
  static constexpr size_t kFlushScratchOffset = msgwire::kFifoBytes + kSizeSlotsBytes;
  static constexpr size_t kControlBytes = kFlushScratchOffset + 64;
  static constexpr uint32_t kSendDepth = 2 * msg::kMaxRequests;
  static constexpr uint32_t kRecvDepth = msg::kMaxRequests * msg::kMaxGroup;

  explicit Endpoint(bool receiver) noexcept : receiver_(receiver) {}
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // A new event channel of our own (non-blocking), for an id that is then made in it or
  // migrated to it. 0 or -errno.
  int OpenChannel() noexcept;
  // `id` is ours from here on (made in, or migrated to, channel()).
  void Adopt(rdma_cm_id* id) noexcept { id_ = id; }
  // The verbs objects on the id's device: `queue_pairs` (1..kMaxQueuePairs) queue pairs in
  // INIT with their receives posted. 0 or -errno.
  int Build(int queue_pairs) noexcept;
  // After the exchange: the queue pair to RTS (the peer writes into our control memory).
  // The extra queue pairs connect to the peer's `extra_qpn` (as many as ours).
  int Ready(const uint32_t* extra_qpn) noexcept;

  Status Register(const msg::Region& region, msg::Memory** out) noexcept;
  Status Deregister(msg::Memory* memory) noexcept;
  // The registration `memory` of this endpoint holding [data, data + size), or null.
  const VerbsMemory* Find(msg::Memory* memory, const void* data, size_t size) const noexcept;

  // A one-byte RDMA READ of `at` (in `memory`) through a queue pair connected to itself,
  // made on the first flush; its completion comes with `wr_id` on cq().
  Status PostFlush(const VerbsMemory* memory, const void* at, uint64_t wr_id) noexcept;

  // Takes the events of our id that arrived (non-blocking, at most every 2 ms): a
  // disconnect or a device removal fails the comm.
  Status CheckEvents() noexcept;
  // Fails the comm for good: every request and later call says `status`.
  Status Fail(Status status, const char* what) noexcept;
  Status error() const noexcept { return error_; }
  // The peer disconnected: no more will come, but what it completed before is still ours
  // to take from the completion queue (a disconnect fails only what did not arrive).
  bool peer_gone() const noexcept { return peer_gone_; }

  rdma_event_channel* channel() const noexcept { return channel_; }
  rdma_cm_id* id() const noexcept { return id_; }
  ibv_qp* qp() const noexcept { return qp_; }  // rdma_cm's: the clear-to-send, the groups
  ibv_qp* qp(int index) const noexcept { return index == 0 ? qp_ : extra_[index - 1]; }
  int queue_pairs() const noexcept { return queue_pairs_; }
  // Which of ours `qp_num` is (0..queue_pairs()-1), -1 for none (the flush queue pair).
  int QueuePairIndex(uint32_t qp_num) const noexcept {
    for (int i = 0; i < queue_pairs_; ++i)
      if (qp(i)->qp_num == qp_num) return i;
    return -1;
  }
  ibv_cq* cq() const noexcept { return cq_; }
  uint8_t* control() const noexcept { return control_; }
  uint32_t control_lkey() const noexcept { return control_mr_->lkey; }
  msgwire::RemoteArea control_area(size_t offset) const noexcept {
    return {uint64_t(uintptr_t(control_ + offset)), control_mr_->rkey};
  }
  uint32_t max_inline() const noexcept { return max_inline_; }
  bool PostRecv(int index) noexcept;  // a zero-length receive, for a WRITE WITH IMMEDIATE
  void SetConnected() noexcept { connected_ = true; }

 private:
  const bool receiver_;
  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_qp* extra_[msgwire::kMaxQueuePairs - 1] = {};
  int queue_pairs_ = 1;
  ibv_qp* flush_qp_ = nullptr;
  uint8_t* control_ = nullptr;
  ibv_mr* control_mr_ = nullptr;
  std::vector<VerbsMemory*> memory_;
  uint32_t max_inline_ = 0;
  uint32_t send_depth_ = 0;
  bool connected_ = false;
  Status error_ = Status::kOk;
  bool peer_gone_ = false;
  uint64_t next_event_check_ms_ = 0;
};

// The comms (msg_comm.cc). Made by msg_connect.cc once their exchange completed.
std::unique_ptr<msg::SendComm> MakeSendComm(std::unique_ptr<Endpoint> ep,
                                            const msgwire::RemoteArea& sizes) noexcept;
std::unique_ptr<msg::RecvComm> MakeRecvComm(std::unique_ptr<Endpoint> ep,
                                            const msgwire::RemoteArea& fifo) noexcept;

// A device's transport (msg_connect.cc).
std::unique_ptr<msg::Transport> MakeTransport(const Device& device) noexcept;

}  // namespace slip::verbs::msgimpl
