// fabric's comms: a send is one tagged message from the caller's buffer, a receive posts
// each of its buffers for the message of its tag (fabric/msg.h). Nothing here allocates,
// locks or blocks; Test moves the comm by reading its completion queue.
#include <poll.h>
#include <rdma/fi_errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <new>

#include "core/log.h"
#include "core/sys.h"
#include "fabric/msg_internal.h"

namespace slip::fabric::msgimpl {

namespace {

// How often Progress looks at the TCP connection, and how long after it ended the comm
// still takes completions before it fails what is outstanding: the peer's last sends may
// have completed on its side before they landed here.
constexpr uint64_t kPeerCheckMs = 2;
constexpr uint64_t kPeerGoneGraceMs = 200;
constexpr int kPeerGoneWaitMs = 100;
// A grouped receive whose later buffers the provider cannot take yet is retried this long
// (moving the completion queue meanwhile) before the comm fails: its earlier buffers are
// posted and cannot be taken back.
constexpr uint64_t kPostRetryMs = 1000;

// The key a registration asks for, unique in the process (a provider that does not choose
// its keys, FI_MR_PROV_KEY unset, refuses a key already in use in the domain).
uint64_t NextKey() noexcept {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

Link::Link(const Device& device, int tcp, bool receiver) noexcept
    : device_(device), receiver_(receiver), tcp_(tcp) {
  for (FabricRequest& r : requests_) {
    r.comm = this;
    for (int i = 0; i < msg::kMaxGroup; ++i) {
      r.ops[i].request = &r;
      r.ops[i].index = uint8_t(i);
    }
  }
}

Link::~Link() {
  // The endpoint goes first (nothing lands in the caller's buffers after), then the
  // registrations it used.
  endpoint_.Close();
  for (FabricMemory* m : memory_) delete m;
  if (tcp_ >= 0) sys::close(tcp_);
}

bool Link::Connect(const msgwire::Hello& peer, uint32_t tag_key, std::string* why) noexcept {
  // Whatever the peer wrote, the provider reads no further than our buffer: a string
  // address ends inside it, and one of a fixed length must have ours.
  uint8_t address[msgwire::kMaxAddressBytes + 1] = {};
  std::copy(peer.address, peer.address + peer.address_len, address);
  if (device_.address_len != 0 && peer.address_len != device_.address_len) {
    *why = "the peer's endpoint address is not one of this provider's";
    return false;
  }
  if (!endpoint_.Insert(address, peer.address_len, &peer_)) {
    *why = "the provider rejected the peer's endpoint address";
    return false;
  }
  tag_key_ = tag_key;
  return true;
}

bool Link::PostHello(bool send, std::string* why) noexcept {
  if (device_.domain->needs_local_mr()) {
    fid_mr* mr = nullptr;
    const int rc = fi_mr_reg(device_.domain->domain(), &hello_word_, sizeof(hello_word_),
                             FI_SEND | FI_RECV, 0, NextKey(), 0, &mr, nullptr);
    if (rc != 0) {
      *why = FabricError("fi_mr_reg", rc);
      return false;
    }
    hello_mr_.reset(mr);
  }
  hello_ = Acquire(1);  // (a new link: every request is free)
  hello_send_ = send;
  hello_posted_ = false;
  hello_->sizes[0] = send ? sizeof(hello_word_) : 0;
  hello_word_ = send ? tag_key_ : 0;
  return TryPostHello(why);
}

bool Link::TryPostHello(std::string* why) noexcept {
  void* desc = hello_mr_ ? fi_mr_desc(hello_mr_.get()) : nullptr;
  hello_->outstanding = 1;
  const ssize_t rc = hello_send_ ? fi_tsend(endpoint_.ep(), &hello_word_, sizeof(hello_word_), desc,
                                            peer_, ControlTag(), &hello_->ops[0].context)
                                 : fi_trecv(endpoint_.ep(), &hello_word_, sizeof(hello_word_), desc,
                                            source(), ControlTag(), 0, &hello_->ops[0].context);
  if (rc == 0) {
    hello_posted_ = true;
    return true;
  }
  hello_->outstanding = 0;
  if (rc == -FI_EAGAIN) return true;  // (a provider still connecting: again on the next call)
  *why = FabricError(hello_send_ ? "fi_tsend" : "fi_trecv", int(rc));
  return false;
}

int Link::HelloDone() noexcept {
  if (hello_ == nullptr) return -1;
  Progress();
  if (error_ != Status::kOk) return -1;
  std::string why;
  if (!hello_posted_ && !TryPostHello(&why)) {
    Fail(Status::kRemote, why.c_str());
    return -1;
  }
  if (!hello_posted_ || hello_->outstanding > 0) return 0;
  // (A send's size is its own; a receive's what arrived: the key, whole.)
  const bool ok = hello_->sizes[0] == sizeof(hello_word_) && hello_word_ == tag_key_;
  Release(hello_);
  hello_ = nullptr;
  return ok ? 1 : -1;
}

bool Link::TcpEnded() const noexcept {
  char byte;
  const ssize_t r = ::recv(tcp_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

Status Link::Register(const msg::Region& region, msg::Memory** out) noexcept {
  if (error_ != Status::kOk) return error_;
  if (region.device || region.dmabuf_fd >= 0) {
    SLIP_LOG(kWarn, "fabric: registration of GPU memory asked of a host-memory device: refused");
    return Status::kBadArgument;
  }
  if (region.data == nullptr && region.size != 0) return Status::kBadArgument;
  try {
    memory_.reserve(memory_.size() + 1);  // (so that the push_back below cannot throw)
  } catch (...) {
    return Status::kSystem;
  }
  std::unique_ptr<FabricMemory> m(new (std::nothrow) FabricMemory);
  if (!m) return Status::kSystem;
  fid_mr* mr = nullptr;
  // (An empty buffer needs no registration: its sends and receives name no descriptor.)
  const int rc = region.size == 0 ? 0
                                  : fi_mr_reg(device_.domain->domain(), region.data, region.size,
                                              FI_SEND | FI_RECV, 0, NextKey(), 0, &mr, nullptr);
  if (rc != 0) {
    SLIP_LOG(kWarn, "fabric: cannot register %zu bytes: %s", region.size,
             FabricError("fi_mr_reg", rc).c_str());
    return rc == -FI_ENOMEM ? Status::kSystem : Status::kInternal;
  }
  m->mr.reset(mr);
  m->desc = mr ? fi_mr_desc(mr) : nullptr;
  m->begin = uintptr_t(region.data);
  m->end = m->begin + region.size;
  memory_.push_back(m.get());
  *out = m.release();
  return Status::kOk;
}

Status Link::Deregister(msg::Memory* memory) noexcept {
  auto* m = static_cast<FabricMemory*>(memory);
  auto it = std::find(memory_.begin(), memory_.end(), m);
  if (memory == nullptr || it == memory_.end()) return Status::kBadArgument;
  memory_.erase(it);
  delete m;
  return Status::kOk;
}

bool Link::Descriptor(msg::Memory* memory, const void* data, size_t size,
                      void** desc) const noexcept {
  *desc = nullptr;
  if (memory == nullptr) return !device_.domain->needs_local_mr() || size == 0;
  // The caller's pointer is checked against our list before it is read.
  const auto* m = static_cast<const FabricMemory*>(memory);
  if (std::find(memory_.begin(), memory_.end(), m) == memory_.end() || !m->Covers(data, size))
    return false;
  *desc = m->desc;
  return true;
}

FabricRequest* Link::Acquire(int n) noexcept {
  for (FabricRequest& r : requests_) {
    if (r.in_use) continue;
    r.in_use = true;
    r.n = n;
    r.outstanding = 0;
    std::fill(std::begin(r.sizes), std::end(r.sizes), 0);
    return &r;
  }
  return nullptr;
}

bool Link::AnyOutstanding() const noexcept {
  for (const FabricRequest& r : requests_)
    if (r.in_use && r.outstanding > 0) return true;
  return false;
}

Status Link::Fail(Status status, const char* what) noexcept {
  if (error_ == Status::kOk) {
    SLIP_LOG(kWarn, "fabric: %s comm failed: %s", device_.info.name, what);
    error_ = status;
  }
  return error_;
}

void Link::Progress() noexcept {
  if (error_ != Status::kOk) return;
  fi_cq_tagged_entry entries[16];
  for (;;) {
    const ssize_t got = fi_cq_read(endpoint_.cq(), entries, std::size(entries));
    if (got == -FI_EAGAIN) break;
    if (got == -FI_EAVAIL) {
      FailCompletion();
      return;
    }
    if (got < 0) {
      Fail(Status::kInternal, FabricError("fi_cq_read", int(got)).c_str());
      return;
    }
    for (ssize_t i = 0; i < got; ++i) {
      auto* op = static_cast<FabricRequest::Op*>(entries[i].op_context);
      FabricRequest* r = op ? op->request : nullptr;
      if (r == nullptr || r->comm != this || !r->in_use || r->outstanding <= 0) {
        Fail(Status::kInternal, "a completion for no request of this comm");
        return;
      }
      if (entries[i].flags & FI_RECV) r->sizes[op->index] = entries[i].len;
      --r->outstanding;
    }
    if (size_t(got) < std::size(entries)) break;
  }
  const uint64_t now = sys::MonotonicMs();
  if (now >= next_check_ms_) CheckPeer(now);
}

bool Link::PeerGoneSoon() const noexcept {
  // A dying peer's provider state may fail before the kernel closed its sockets: give the
  // TCP connection a moment to say so (the comm is failing anyway; this only names why).
  pollfd p{tcp_, POLLIN | POLLRDHUP, 0};
  sys::poll(&p, 1, kPeerGoneWaitMs);
  return TcpEnded();
}

void Link::FailCompletion() noexcept {
  fi_cq_err_entry err{};
  char text[256];
  if (fi_cq_readerr(endpoint_.cq(), &err, 0) != 1) {
    Fail(Status::kInternal, "a completion in error that cannot be read");
    return;
  }
  const char* provider = fi_cq_strerror(endpoint_.cq(), err.prov_errno, err.err_data, nullptr, 0);
  if (err.err == FI_ETRUNC || err.err == -FI_ETRUNC) {  // (shm says it negative)
    snprintf(text, sizeof(text), "a message larger than the receive posted for its tag: refused");
  } else if (PeerGoneSoon()) {
    snprintf(text, sizeof(text), "the %s closed its comm or exited (%s)",
             receiver_ ? "sender" : "receiver", fi_strerror(err.err));
  } else {
    snprintf(text, sizeof(text), "a completion in error: %s (provider: %s)", fi_strerror(err.err),
             provider ? provider : "?");
  }
  Fail(Status::kRemote, text);
}

void Link::CheckPeer(uint64_t now_ms) noexcept {
  next_check_ms_ = now_ms + kPeerCheckMs;
  if (peer_gone_ms_ == 0) {
    if (!TcpEnded()) return;
    peer_gone_ms_ = now_ms;  // EOF or an error: the peer closed its comm, or died
  }
  if (AnyOutstanding() && now_ms - peer_gone_ms_ >= kPeerGoneGraceMs)
    Fail(Status::kRemote, receiver_
                              ? "the sender closed its comm or exited (its connection ended)"
                              : "the receiver closed its comm or exited (its connection ended)");
}

Status FabricRequest::Test(bool* done, size_t out_sizes[msg::kMaxGroup], int* count) noexcept {
  *done = false;
  comm->Progress();
  if (comm->error() != Status::kOk) {
    in_use = false;
    return comm->error();
  }
  if (outstanding > 0) return Status::kOk;
  std::copy(sizes, sizes + n, out_sizes);
  *count = n;
  *done = true;
  in_use = false;
  return Status::kOk;
}

namespace {

// Either end of a comm: its link, which holds the registrations.
template <typename End>
class OnLink : public End {
 public:
  explicit OnLink(std::unique_ptr<Link> comm) noexcept : comm_(std::move(comm)) {}
  Status Register(const msg::Region& region, msg::Memory** out) noexcept override {
    return comm_->Register(region, out);
  }
  Status Deregister(msg::Memory* memory) noexcept override { return comm_->Deregister(memory); }

 protected:
  std::unique_ptr<Link> comm_;
};

class FabricSendComm final : public OnLink<msg::SendComm> {
 public:
  using OnLink::OnLink;

  Status Send(const void* data, size_t size, int tag, msg::Memory* memory,
              msg::Request** out) noexcept override {
    if (comm_->error() != Status::kOk) return comm_->error();
    void* desc = nullptr;
    if (!comm_->Descriptor(memory, data, size, &desc)) return Status::kBadArgument;
    FabricRequest* r = comm_->Acquire(1);
    if (r == nullptr) return Status::kAgain;
    r->outstanding = 1;
    r->sizes[0] = size;
    const ssize_t rc = fi_tsend(comm_->endpoint().ep(), data, size, desc, comm_->peer(),
                                comm_->Tag(tag), &r->ops[0].context);
    if (rc == 0) {
      *out = r;
      return Status::kOk;
    }
    comm_->Release(r);
    if (rc == -FI_EAGAIN) {
      comm_->Progress();  // (the provider frees room as completions are taken)
      return Status::kAgain;
    }
    return comm_->Fail(Status::kRemote, FabricError("fi_tsend", int(rc)).c_str());
  }
};

class FabricRecvComm final : public OnLink<msg::RecvComm> {
 public:
  using OnLink::OnLink;

  Status Recv(int n, void* const* data, const size_t* sizes, const int* tags,
              msg::Memory* const* memory, msg::Request** out) noexcept override {
    if (comm_->error() != Status::kOk) return comm_->error();
    void* desc[msg::kMaxGroup] = {};
    for (int i = 0; i < n; ++i)
      if (!comm_->Descriptor(memory[i], data[i], sizes[i], &desc[i])) return Status::kBadArgument;
    FabricRequest* r = comm_->Acquire(n);
    if (r == nullptr) return Status::kAgain;
    uint64_t give_up_ms = 0;
    for (int i = 0; i < n;) {
      r->outstanding = i + 1;  // before the post: its completion may be read meanwhile
      const ssize_t rc = fi_trecv(comm_->endpoint().ep(), data[i], sizes[i], desc[i],
                                  comm_->source(), comm_->Tag(tags[i]), 0, &r->ops[i].context);
      if (rc == 0) {
        ++i;
        continue;
      }
      r->outstanding = i;
      if (rc != -FI_EAGAIN) return Broken(r, FabricError("fi_trecv", int(rc)).c_str());
      if (i == 0) {  // nothing posted: NCCL calls again
        comm_->Release(r);
        comm_->Progress();
        return Status::kAgain;
      }
      const uint64_t now = sys::MonotonicMs();
      if (give_up_ms == 0) give_up_ms = now + kPostRetryMs;
      if (now >= give_up_ms) return Broken(r, "the provider takes no more receives");
      comm_->Progress();
      if (comm_->error() != Status::kOk) return Broken(r, "");
    }
    *out = r;
    return Status::kOk;
  }

 private:
  // Part of a grouped receive is posted and cannot be taken back: the comm cannot go on.
  Status Broken(FabricRequest* r, const char* what) noexcept {
    comm_->Release(r);
    return comm_->Fail(Status::kRemote, what);
  }
};

}  // namespace

std::unique_ptr<msg::SendComm> MakeSendComm(std::unique_ptr<Link> comm) noexcept {
  return std::unique_ptr<msg::SendComm>(new (std::nothrow) FabricSendComm(std::move(comm)));
}

std::unique_ptr<msg::RecvComm> MakeRecvComm(std::unique_ptr<Link> comm) noexcept {
  return std::unique_ptr<msg::RecvComm>(new (std::nothrow) FabricRecvComm(std::move(comm)));
}

}  // namespace slip::fabric::msgimpl
