// verbs' message comms: the data path (verbs/msg.h, the wire in verbs/msg_wire.h).
//
// Nothing here allocates, locks or makes a system call other than the device's own post and
// poll: requests live in fixed arrays, a receive's storage is indexed by its seq.
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/log.h"
#include "verbs/msg_internal.h"

namespace slip::verbs::msgimpl {

namespace {

using msgwire::CtsEntry;
using msgwire::kCtsEntryBytes;
using msgwire::kCtsSlotBytes;
using msgwire::RemoteArea;

constexpr int kPollBatch = 16;
constexpr uint64_t kCtsWrId = uint64_t(1) << 63;    // a receiver's CTS write (nothing waits on it)
constexpr uint64_t kFlushWrId = uint64_t(1) << 62;  // a receiver's flush (its request waits)

uint32_t SlotOf(uint32_t seq) noexcept {
  return seq % uint32_t(msg::kMaxRequests);
}

// Where buffer `index` of receive `seq` has its size word (the receiver's size slots, and
// the sender's words it writes them from).
size_t SizeWordOffset(uint32_t seq, uint32_t index) noexcept {
  return (size_t(SlotOf(seq)) * msg::kMaxGroup + index) * 4;
}

Status CompletionError(Endpoint* ep, const ibv_wc& wc) noexcept {
  char what[160];
  snprintf(what, sizeof(what), "work completion error: %s (vendor error 0x%x)",
           ibv_wc_status_str(wc.status), wc.vendor_err);
  return ep->Fail(Status::kRemote, what);
}

// What both ends do with their endpoint: own it, and register through it.
template <typename Base>
class EndpointComm : public Base {
 public:
  Status Register(const msg::Region& region, msg::Memory** out) noexcept override {
    return ep_->Register(region, out);
  }
  Status Deregister(msg::Memory* memory) noexcept override { return ep_->Deregister(memory); }

 protected:
  explicit EndpointComm(std::unique_ptr<Endpoint> ep) noexcept : ep_(std::move(ep)) {}
  std::unique_ptr<Endpoint> ep_;
};

class VerbsSendComm;

struct SendRequest final : msg::Request {
  VerbsSendComm* comm = nullptr;
  size_t size = 0;
  bool in_use = false;
  int pending = 0;  // completions still to come, one per queue pair it went through
  Status Test(bool* done_out, size_t sizes[msg::kMaxGroup], int* count) noexcept override;
};

class VerbsSendComm final : public EndpointComm<msg::SendComm> {
 public:
  VerbsSendComm(std::unique_ptr<Endpoint> ep, const RemoteArea& sizes) noexcept
      : EndpointComm(std::move(ep)), sizes_(sizes) {
    for (auto& r : requests_) r.comm = this;
  }

  Status Send(const void* data, size_t size, int tag, msg::Memory* memory,
              msg::Request** out) noexcept override {
    *out = nullptr;
    if (Status s = ep_->CheckEvents(); s != Status::kOk) return s;
    if (!slot_ready_ && !ReadSlot()) {
      if (Status s = Poll(); s != Status::kOk) return s;
      return ep_->error() == Status::kOk ? Status::kAgain : ep_->error();
    }
    int index = -1;
    for (int i = 0; i < group_; ++i) {
      if (!(matched_ & (1u << i)) && entries_[i].tag == tag) {
        index = i;
        break;
      }
    }
    if (index < 0) return Status::kAgain;  // a send of the group for another tag first
    const CtsEntry& e = entries_[index];
    if (size > e.capacity) {
      SLIP_LOG(kWarn, "NCCL send of %zu bytes (tag %d) to a receive of %u bytes: refused", size,
               tag, e.capacity);
      return Status::kBadArgument;
    }
    const VerbsMemory* m = size > 0 ? ep_->Find(memory, data, size) : nullptr;
    if (size > 0 && m == nullptr) {
      SLIP_LOG(kWarn, "verbs: a send from %p (%zu bytes) outside the registration it names", data,
               size);
      return Status::kBadArgument;
    }
    SendRequest* r = FreeRequest();
    if (r == nullptr) return Status::kAgain;

    const uint64_t wr_id = uint64_t(r - requests_);
    const int qps = ep_->queue_pairs();
    if (group_ == 1) {
      // The bytes with their count in the immediate: one write per queue pair, each a
      // 128-byte aligned part; a queue pair past the bytes writes nothing, so that every
      // queue pair completes every receive (the receiver counts on it).
      const size_t part =
          qps == 1 ? size : ((size + size_t(qps) - 1) / size_t(qps) + 127) & ~size_t(127);
      for (int q = 0; q < qps; ++q) {
        const size_t offset = std::min(size, size_t(q) * part);
        const size_t length = std::min(part, size - offset);
        ibv_sge sge{uint64_t(uintptr_t(data)) + offset, uint32_t(length),
                    length > 0 ? m->mr->lkey : 0};
        ibv_send_wr wr{};
        wr.wr_id = wr_id;
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.sg_list = &sge;
        wr.num_sge = length > 0 ? 1 : 0;
        wr.send_flags =
            IBV_SEND_SIGNALED | (length > 0 && length <= ep_->max_inline() ? IBV_SEND_INLINE : 0);
        wr.imm_data = htonl(msgwire::kImmSingle | uint32_t(size));
        wr.wr.rdma.remote_addr = e.addr + offset;
        wr.wr.rdma.rkey = e.rkey;
        if (Status st = Post(q, &wr); st != Status::kOk) return st;
      }
      return Posted(r, index, size, qps, out);
    }
    // A buffer of a grouped receive, on the first queue pair: the bytes, then their count
    // into the receive's size slot, with the immediate naming receive and buffer; the other
    // queue pairs each complete it with a zero-length write of the same immediate.
    const size_t word_offset = msgwire::kFifoBytes + SizeWordOffset(seq_, uint32_t(index));
    auto* word = reinterpret_cast<uint32_t*>(ep_->control() + word_offset);
    *word = uint32_t(size);
    ibv_sge sge[2]{};
    ibv_send_wr wr[2]{};
    ibv_send_wr* first = &wr[1];
    if (size > 0) {
      sge[0] = {uint64_t(uintptr_t(data)), uint32_t(size), m->mr->lkey};
      wr[0].opcode = IBV_WR_RDMA_WRITE;
      wr[0].sg_list = &sge[0];
      wr[0].num_sge = 1;
      wr[0].wr.rdma.remote_addr = e.addr;
      wr[0].wr.rdma.rkey = e.rkey;
      wr[0].next = &wr[1];
      first = &wr[0];
    }
    sge[1] = {uint64_t(uintptr_t(word)), 4, ep_->control_lkey()};
    wr[1].wr_id = wr_id;
    wr[1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr[1].sg_list = &sge[1];
    wr[1].num_sge = 1;
    wr[1].send_flags = IBV_SEND_SIGNALED | (ep_->max_inline() >= 4 ? IBV_SEND_INLINE : 0);
    wr[1].imm_data = htonl(msgwire::EncodeImm(seq_, uint32_t(index)));
    wr[1].wr.rdma.remote_addr = sizes_.addr + SizeWordOffset(seq_, uint32_t(index));
    wr[1].wr.rdma.rkey = sizes_.rkey;
    if (Status st = Post(0, first); st != Status::kOk) return st;
    for (int q = 1; q < qps; ++q) {
      ibv_send_wr mark{};
      mark.wr_id = wr_id;
      mark.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      mark.send_flags = IBV_SEND_SIGNALED;
      mark.imm_data = wr[1].imm_data;
      mark.wr.rdma.remote_addr = sizes_.addr;
      mark.wr.rdma.rkey = sizes_.rkey;
      if (Status st = Post(q, &mark); st != Status::kOk) return st;
    }
    return Posted(r, index, size, qps, out);
  }

  Status Post(int q, ibv_send_wr* first) noexcept {
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(ep_->qp(q), first, &bad); rc != 0) {
      char what[96];
      snprintf(what, sizeof(what), "cannot post a send: %s", strerror(rc));
      return ep_->Fail(Status::kSystem, what);
    }
    return Status::kOk;
  }

  // The request is under way: `completions` to wait for, one per queue pair.
  Status Posted(SendRequest* r, int index, size_t size, int completions,
                msg::Request** out) noexcept {
    r->in_use = true;
    r->pending = completions;
    r->size = size;
    matched_ |= 1u << index;
    if (matched_ == (1u << group_) - 1) {  // the receive's last buffer: the next one's turn
      ++seq_;
      slot_ready_ = false;
    }
    *out = r;
    return Status::kOk;
  }

  Status TestSend(SendRequest* r, bool* done, size_t sizes[msg::kMaxGroup], int* count) noexcept {
    *done = false;
    if (!r->in_use) return Status::kBadArgument;
    if (Status s = Poll(); s != Status::kOk) return s;
    if (r->pending == 0) {
      sizes[0] = r->size;
      *count = 1;
      r->in_use = false;
      *done = true;
      return Status::kOk;
    }
    return ep_->CheckEvents();
  }

 private:
  SendRequest* FreeRequest() noexcept {
    for (auto& r : requests_)
      if (!r.in_use) return &r;
    return nullptr;
  }

  // The receive `seq_` if its entries are all in the FIFO: validated and copied out once.
  bool ReadSlot() noexcept {
    const uint8_t* slot = ep_->control() + size_t(SlotOf(seq_)) * kCtsSlotBytes;
    const uint32_t stamp = msgwire::StampFor(seq_);
    CtsEntry first;
    if (!ReadEntry(slot, stamp, &first)) return false;
    for (int i = 1; i < first.group; ++i) {
      if (!ReadEntry(slot + size_t(i) * kCtsEntryBytes, stamp, &entries_[i])) return false;
      if (entries_[i].group != first.group) {
        ep_->Fail(Status::kRemote, "the receiver's clear-to-send entries disagree on their group");
        return false;
      }
    }
    entries_[0] = first;
    group_ = first.group;
    matched_ = 0;
    slot_ready_ = true;
    return true;
  }

  bool ReadEntry(const uint8_t* at, uint32_t stamp, CtsEntry* out) noexcept {
    // The device writes this memory: one look at the stamp, then one copy that is parsed.
    if (msgwire::CtsStamp(at) != stamp) return false;
    std::atomic_thread_fence(std::memory_order_acquire);
    uint8_t copy[kCtsEntryBytes];
    std::memcpy(copy, at, sizeof(copy));
    if (!msgwire::ParseCts(copy, stamp, out)) {
      ep_->Fail(Status::kRemote, "a malformed clear-to-send entry");
      return false;
    }
    return true;
  }

  Status Poll() noexcept {
    if (ep_->error() != Status::kOk && !ep_->peer_gone()) return ep_->error();
    ibv_wc wc[kPollBatch];
    const int n = ibv_poll_cq(ep_->cq(), kPollBatch, wc);
    if (n < 0) return ep_->Fail(Status::kSystem, "cannot poll the completion queue");
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) return CompletionError(ep_.get(), wc[i]);
      if (wc[i].wr_id < uint64_t(msg::kMaxRequests) && requests_[wc[i].wr_id].pending > 0)
        --requests_[wc[i].wr_id].pending;
    }
    return Status::kOk;
  }

  const RemoteArea sizes_;
  uint32_t seq_ = 0;  // the receive the next send is for
  bool slot_ready_ = false;
  int group_ = 0;
  uint32_t matched_ = 0;
  CtsEntry entries_[msg::kMaxGroup];
  SendRequest requests_[msg::kMaxRequests];
};

Status SendRequest::Test(bool* done_out, size_t sizes[msg::kMaxGroup], int* count) noexcept {
  return comm->TestSend(this, done_out, sizes, count);
}

class VerbsRecvComm;

struct FlushRequest final : msg::Request {
  VerbsRecvComm* comm = nullptr;
  bool in_use = false;
  bool done = false;
  Status Test(bool* done_out, size_t sizes_out[msg::kMaxGroup], int* count) noexcept override;
};

struct RecvRequest final : msg::Request {
  VerbsRecvComm* comm = nullptr;
  uint32_t seq = 0;
  int n = 0;
  int arrived = 0;  // completions so far: n from each queue pair make it whole
  uint32_t marks[msgwire::kMaxQueuePairs] = {};  // a group's: the buffers each queue pair completed
  uint32_t capacity[msg::kMaxGroup] = {};
  size_t sizes[msg::kMaxGroup] = {};
  bool in_use = false;
  Status Test(bool* done_out, size_t sizes_out[msg::kMaxGroup], int* count) noexcept override;
};

class VerbsRecvComm final : public EndpointComm<msg::RecvComm> {
 public:
  VerbsRecvComm(std::unique_ptr<Endpoint> ep, const RemoteArea& fifo) noexcept
      : EndpointComm(std::move(ep)), fifo_(fifo) {
    for (auto& r : requests_) r.comm = this;
    for (auto& f : flushes_) f.comm = this;
  }

  // One READ from the last non-empty buffer that is GPU memory (or any, with
  // SLIP_NCCL_FLUSH=1): the NIC wrote the group's buffers in order, so reading the last
  // flushes them all.
  Status Flush(int n, void* const* data, const size_t* sizes, msg::Memory* const* memory,
               msg::Request** out) noexcept override {
    *out = nullptr;
    if (Status s = ep_->CheckEvents(); s != Status::kOk) return s;
    if (n < 1 || n > msg::kMaxGroup) return Status::kBadArgument;
    int last = -1;
    const VerbsMemory* last_memory = nullptr;
    for (int i = 0; i < n; ++i) {
      const VerbsMemory* m = sizes[i] > 0 && memory ? ep_->Find(memory[i], data[i], 1) : nullptr;
      if (m && (m->device || msg::KeptSetup<MessageSetup>().flush_host_memory)) {
        last = i;
        last_memory = m;
      }
    }
    if (last < 0) return Status::kOk;  // host memory the CPU reads: nothing to flush
    FlushRequest* f = nullptr;
    for (auto& candidate : flushes_)
      if (!candidate.in_use) f = &candidate;
    if (f == nullptr) return Status::kAgain;
    if (Status s = ep_->PostFlush(last_memory, data[last], kFlushWrId | uint64_t(f - flushes_));
        s != Status::kOk)
      return s;
    f->in_use = true;
    f->done = false;
    *out = f;
    return Status::kOk;
  }

  Status TestFlush(FlushRequest* f, bool* done, int* count) noexcept {
    *done = false;
    if (!f->in_use) return Status::kBadArgument;
    if (Status s = Poll(); s != Status::kOk) return s;
    if (!f->done) return ep_->CheckEvents();
    f->in_use = false;
    *count = 0;
    *done = true;
    return Status::kOk;
  }

  Status Recv(int n, void* const* data, const size_t* sizes, const int* tags,
              msg::Memory* const* memory, msg::Request** out) noexcept override {
    *out = nullptr;
    if (Status s = ep_->CheckEvents(); s != Status::kOk) return s;
    if (n < 1 || n > msg::kMaxGroup) return Status::kBadArgument;
    RecvRequest& r = requests_[SlotOf(seq_)];
    if (r.in_use) {
      if (Status s = Poll(); s != Status::kOk) return s;
      return Status::kAgain;
    }
    const uint32_t slot = SlotOf(seq_);
    uint8_t* staging = ep_->control() + Endpoint::kSizeSlotsBytes + size_t(slot) * kCtsSlotBytes;
    for (int i = 0; i < n; ++i) {
      const uint32_t capacity = sizes[i] > size_t(INT_MAX) ? uint32_t(INT_MAX) : uint32_t(sizes[i]);
      const VerbsMemory* m =
          capacity > 0 ? ep_->Find(memory ? memory[i] : nullptr, data[i], capacity) : nullptr;
      if (capacity > 0 && m == nullptr) {
        SLIP_LOG(kWarn, "verbs: a receive into %p (%u bytes) outside the registration it names",
                 data[i], capacity);
        return Status::kBadArgument;
      }
      CtsEntry e;
      e.addr = uint64_t(uintptr_t(data[i]));
      e.rkey = m ? m->mr->rkey : 0;
      e.capacity = capacity;
      e.tag = tags[i];
      e.group = uint8_t(n);
      e.stamp = msgwire::StampFor(seq_);
      msgwire::EncodeCts(e, staging + size_t(i) * kCtsEntryBytes);
      r.capacity[i] = capacity;
      r.sizes[i] = 0;
    }
    const uint32_t bytes = uint32_t(n) * uint32_t(kCtsEntryBytes);
    ibv_sge sge{uint64_t(uintptr_t(staging)), bytes, ep_->control_lkey()};
    ibv_send_wr wr{};
    wr.wr_id = kCtsWrId | slot;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED | (bytes <= ep_->max_inline() ? IBV_SEND_INLINE : 0);
    wr.wr.rdma.remote_addr = fifo_.addr + uint64_t(slot) * kCtsSlotBytes;
    wr.wr.rdma.rkey = fifo_.rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(ep_->qp(), &wr, &bad); rc != 0) {
      char what[96];
      snprintf(what, sizeof(what), "cannot post a clear-to-send: %s", strerror(rc));
      return ep_->Fail(Status::kSystem, what);
    }
    r.seq = seq_;
    r.n = n;
    r.arrived = 0;
    for (uint32_t& m : r.marks) m = 0;
    r.in_use = true;
    ++seq_;
    *out = &r;
    return Status::kOk;
  }

  Status TestRecv(RecvRequest* r, bool* done, size_t sizes[msg::kMaxGroup], int* count) noexcept {
    *done = false;
    if (!r->in_use) return Status::kBadArgument;
    if (Status s = Poll(); s != Status::kOk) return s;
    if (r->arrived == r->n * ep_->queue_pairs()) {
      for (int i = 0; i < r->n; ++i) sizes[i] = r->sizes[i];
      *count = r->n;
      r->in_use = false;
      *done = true;
      return Status::kOk;
    }
    return ep_->CheckEvents();
  }

 private:
  Status Poll() noexcept {
    if (ep_->error() != Status::kOk && !ep_->peer_gone()) return ep_->error();
    ibv_wc wc[kPollBatch];
    const int n = ibv_poll_cq(ep_->cq(), kPollBatch, wc);
    if (n < 0) return ep_->Fail(Status::kSystem, "cannot poll the completion queue");
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) return CompletionError(ep_.get(), wc[i]);
      if ((wc[i].wr_id & kFlushWrId) && wc[i].opcode == IBV_WC_RDMA_READ) {
        flushes_[(wc[i].wr_id & ~kFlushWrId) % msg::kMaxRequests].done = true;
        continue;
      }
      if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM) continue;  // our CTS writes
      const int q = ep_->QueuePairIndex(wc[i].qp_num);
      if (q < 0) return ep_->Fail(Status::kInternal, "a completion of no queue pair of ours");
      if (Status s = OnSendDone(q, ntohl(wc[i].imm_data)); s != Status::kOk) return s;
      if (!ep_->PostRecv(q)) return ep_->Fail(Status::kSystem, "cannot post a receive");
    }
    return Status::kOk;
  }

  // Queue pair `q` says its part of a buffer of the oldest receive it has not completed
  // is written (a queue pair delivers in the order the receives were posted, and every one
  // completes every buffer: a receive of one buffer once, a group's buffers once each):
  // everything in it (the immediate, the size word) is the peer's, checked against what
  // we posted.
  Status OnSendDone(int q, uint32_t imm) noexcept {
    uint32_t& cursor = arriving_[q];
    RecvRequest& r = requests_[SlotOf(cursor)];
    if (!r.in_use || r.seq != cursor)
      return ep_->Fail(Status::kRemote, "the sender completed a send for no posted receive");
    if (imm & msgwire::kImmSingle) {
      const uint32_t size = imm & ~msgwire::kImmSingle;
      if (r.n != 1)
        return ep_->Fail(Status::kRemote, "the sender completed a grouped receive as a single");
      if (size > r.capacity[0])
        return ep_->Fail(Status::kRemote, "the sender wrote more than the receive's buffer holds");
      if (r.arrived > 0 && r.sizes[0] != size)
        return ep_->Fail(Status::kRemote, "the queue pairs disagree on the size of a send");
      r.sizes[0] = size;
      ++r.arrived;
      ++cursor;
      return Status::kOk;
    }
    const uint32_t index = msgwire::ImmIndex(imm);
    if (msgwire::ImmSeq(imm) != (cursor & msgwire::kImmSeqMask) || index >= uint32_t(r.n) ||
        (r.marks[q] & (1u << index)))
      return ep_->Fail(Status::kRemote, "the sender completed a send for no posted buffer");
    if (q == 0) {  // the first queue pair carried the bytes and their count
      const auto* words = reinterpret_cast<const volatile uint32_t*>(ep_->control());
      const uint32_t size = words[SizeWordOffset(cursor, index) / 4];
      if (size > r.capacity[index])
        return ep_->Fail(Status::kRemote, "the sender wrote more than the receive's buffer holds");
      r.sizes[index] = size;
    }
    r.marks[q] |= 1u << index;
    ++r.arrived;
    if (r.marks[q] == (1u << r.n) - 1) ++cursor;
    return Status::kOk;
  }

  const RemoteArea fifo_;
  uint32_t seq_ = 0;  // the next receive's
  // Per queue pair, the oldest receive it has not completed yet.
  uint32_t arriving_[msgwire::kMaxQueuePairs] = {};
  RecvRequest requests_[msg::kMaxRequests];  // receive seq's at [seq % kMaxRequests]
  FlushRequest flushes_[msg::kMaxRequests];
};

Status FlushRequest::Test(bool* done_out, size_t sizes_out[msg::kMaxGroup], int* count) noexcept {
  (void)sizes_out;
  return comm->TestFlush(this, done_out, count);
}

Status RecvRequest::Test(bool* done_out, size_t sizes_out[msg::kMaxGroup], int* count) noexcept {
  return comm->TestRecv(this, done_out, sizes_out, count);
}

}  // namespace

std::unique_ptr<msg::SendComm> MakeSendComm(std::unique_ptr<Endpoint> ep,
                                            const RemoteArea& sizes) noexcept {
  return std::unique_ptr<msg::SendComm>(new (std::nothrow) VerbsSendComm(std::move(ep), sizes));
}

std::unique_ptr<msg::RecvComm> MakeRecvComm(std::unique_ptr<Endpoint> ep,
                                            const RemoteArea& fifo) noexcept {
  return std::unique_ptr<msg::RecvComm>(new (std::nothrow) VerbsRecvComm(std::move(ep), fifo));
}

}  // namespace slip::verbs::msgimpl
