// fabric's message comms, inside the module: the objects behind fabric/msg.h.
#pragma once

#include <rdma/fi_tagged.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/msg_comm.h"
#include "core/msg_module.h"
#include "fabric/domain.h"
#include "fabric/msg.h"
#include "fabric/msg_wire.h"

namespace slip::fabric::msgimpl {

using msg::Status;

// One domain as the NCCL face sees it.
struct Device {
  std::unique_ptr<Domain> domain;
  msg::DeviceInfo info;
  size_t address_len = 0;  // the length of this provider's endpoint addresses (0: varies)
};

// A registration of the caller's buffer in the comm's domain, owned by the comm (which
// knows its own by its list: a pointer the caller hands back is looked up, never trusted).
class FabricMemory final : public msg::Memory {
 public:
  MrPtr mr;
  void* desc = nullptr;  // fi_mr_desc: what a send or receive names
  uintptr_t begin = 0, end = 0;
  bool Covers(const void* data, size_t size) const noexcept {
    const uintptr_t p = uintptr_t(data);
    return p >= begin && p <= end && size <= end - p;
  }
};

class Link;

// One send or one grouped receive; each buffer's operation carries its own context.
class FabricRequest final : public msg::Request {
 public:
  struct Op {
    fi_context2 context;  // first: a completion's op_context is the Op
    FabricRequest* request = nullptr;
    uint8_t index = 0;
  };
  Status Test(bool* done, size_t sizes[msg::kMaxGroup], int* count) noexcept override;

  Link* comm = nullptr;
  bool in_use = false;
  int n = 0;            // buffers (1 for a send)
  int outstanding = 0;  // operations not completed yet
  size_t sizes[msg::kMaxGroup] = {};
  Op ops[msg::kMaxGroup];
};

// What both ends of a comm stand on: the endpoint, the peer, the TCP connection that says the peer
// lives, the requests' storage and the registrations.
class Link {
 public:
  Link(const Device& device, int tcp, bool receiver) noexcept;
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  Endpoint& endpoint() noexcept { return endpoint_; }
  const Device& device() const noexcept { return device_; }
  // After the exchange: the peer's endpoint and the comm's tag key.
  bool Connect(const msgwire::Hello& peer, uint32_t tag_key, std::string* why) noexcept;

  Status Register(const msg::Region& region, msg::Memory** out) noexcept;
  Status Deregister(msg::Memory* memory) noexcept;
  // The descriptor a send or receive of [data, data + size) names (null where the provider
  // needs none); false for a registration that is not this comm's or does not hold it.
  bool Descriptor(msg::Memory* memory, const void* data, size_t size, void** desc) const noexcept;

  // The exchange's last step, on the fabric itself: the sender sends the comm's tag key
  // as a tagged message of the control tag, and its comm is up once that completed
  // (delivered, where the provider says so); the receiver's comm is up once it arrived.
  // Until then neither side has a comm NCCL could drive alone: a provider that connects
  // on first contact (ofi_rxm) gets both ends moving its handshake. PostHello starts it;
  // HelloDone says 1 done, 0 not yet, -1 failed.
  bool PostHello(bool send, std::string* why) noexcept;
  int HelloDone() noexcept;
  // The TCP connection ended (a peek: what is unread stays).
  bool TcpEnded() const noexcept;

  // A free request, or null when kMaxRequests are in flight.
  FabricRequest* Acquire(int n) noexcept;
  void Release(FabricRequest* r) noexcept { r->in_use = false; }
  // Takes what completed, and looks at the TCP connection every few milliseconds.
  void Progress() noexcept;
  // Fails the comm for good: every request and later call says `status`.
  Status Fail(Status status, const char* what) noexcept;
  Status error() const noexcept { return error_; }

  fi_addr_t peer() const noexcept { return peer_; }
  uint64_t Tag(int tag) const noexcept { return msgwire::DataTag(tag_key_, tag); }
  uint64_t ControlTag() const noexcept { return msgwire::ControlTag(tag_key_); }
  // Where receives take messages from: the peer, where the provider can tell.
  fi_addr_t source() const noexcept {
    return device_.domain->directed_recv() ? peer_ : FI_ADDR_UNSPEC;
  }

 private:
  bool TryPostHello(std::string* why) noexcept;
  void CheckPeer(uint64_t now_ms) noexcept;
  // Fails the comm for the completion in error at the head of the queue, named by its
  // cause: the peer gone, a message larger than its receive, the provider's own.
  void FailCompletion() noexcept;
  bool PeerGoneSoon() const noexcept;
  bool AnyOutstanding() const noexcept;

  const Device& device_;
  const bool receiver_;
  Endpoint endpoint_;
  uint64_t hello_word_ = 0;  // what the hello carries: the tag key
  MrPtr hello_mr_;           // its registration, where the provider needs one
  FabricRequest* hello_ = nullptr;
  bool hello_send_ = false;
  bool hello_posted_ = false;
  int tcp_;
  fi_addr_t peer_ = FI_ADDR_UNSPEC;
  uint32_t tag_key_ = 0;
  Status error_ = Status::kOk;
  uint64_t next_check_ms_ = 0;
  uint64_t peer_gone_ms_ = 0;  // when the TCP connection ended (0: it has not)
  FabricRequest requests_[msg::kMaxRequests];
  std::vector<FabricMemory*> memory_;
};

// Completion queue entries per comm: every buffer of every request in flight, twice.
constexpr size_t kCqEntries = 2 * msg::kMaxRequests * msg::kMaxGroup;

// The comms (msg_comm.cc), made by msg_connect.cc once their exchange completed.
std::unique_ptr<msg::SendComm> MakeSendComm(std::unique_ptr<Link> comm) noexcept;
std::unique_ptr<msg::RecvComm> MakeRecvComm(std::unique_ptr<Link> comm) noexcept;

// A device's transport (msg_connect.cc).
std::unique_ptr<msg::Transport> MakeTransport(const Device& device) noexcept;

}  // namespace slip::fabric::msgimpl
