// One end of a verbs message comm: its verbs objects and registrations (msg_internal.h).
#include <fcntl.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/log.h"
#include "core/sys.h"
#include "verbs/msg_internal.h"
#include "verbs/qp.h"

namespace slip::verbs::msgimpl {

namespace {

// How often a comm looks for rdma_cm events (a disconnect) while it is driven.
constexpr uint64_t kEventCheckMs = 2;

void LogRegistrationFailure(size_t size, int err) noexcept {
  rlimit rl{};
  if (err == ENOMEM && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    SLIP_LOG(kWarn,
             "verbs: cannot register %zu KiB for an NCCL comm: RLIMIT_MEMLOCK is %lu KiB "
             "(raise it: ulimit -l unlimited)",
             size / 1024, (unsigned long)(rl.rlim_cur / 1024));
  } else {
    SLIP_LOG(kWarn, "verbs: cannot register %zu KiB for an NCCL comm: %s", size / 1024,
             strerror(err));
  }
}

}  // namespace

Endpoint::~Endpoint() {
  // A disconnect tells the peer at once (its requests fail) rather than by retries.
  if (id_ && connected_) rdma_disconnect(id_);
  if (qp_) ibv_destroy_qp(qp_);
  for (ibv_qp* extra : extra_)
    if (extra) ibv_destroy_qp(extra);
  if (flush_qp_) ibv_destroy_qp(flush_qp_);
  for (VerbsMemory* m : memory_) {
    if (m->mr) ibv_dereg_mr(m->mr);
    m->magic = 0;
    delete m;
  }
  if (control_mr_) ibv_dereg_mr(control_mr_);
  if (cq_) ibv_destroy_cq(cq_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (id_) rdma_destroy_id(id_);  // every event of it was acknowledged as it was taken
  if (channel_) rdma_destroy_event_channel(channel_);
  free(control_);
}

int Endpoint::OpenChannel() noexcept {
  channel_ = rdma_create_event_channel();
  if (!channel_) return -(errno ? errno : ENOMEM);
  const int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return -(errno ? errno : EINVAL);
  return 0;
}

int Endpoint::Build(int queue_pairs) noexcept {
  if (!id_ || !id_->verbs) return -ENODEV;
  if (queue_pairs < 1 || queue_pairs > msgwire::kMaxQueuePairs) return -EINVAL;
  queue_pairs_ = queue_pairs;
  pd_ = ibv_alloc_pd(id_->verbs);
  if (!pd_) return -(errno ? errno : ENOMEM);
  // Every queue pair's sends and receives, and the flush queue pair's reads.
  const int cqe = int(uint32_t(queue_pairs) * (kSendDepth + kRecvDepth) + msg::kMaxRequests);
  cq_ = ibv_create_cq(id_->verbs, cqe, nullptr, nullptr, 0);
  if (!cq_) return -(errno ? errno : ENOMEM);
  QueuePairCaps caps;
  caps.send_depth = kSendDepth;
  caps.recv_depth = receiver_ ? kRecvDepth : 1;
  caps.inline_wanted = 64;  // a size word; a CTS entry or two
  for (int i = 0; i < queue_pairs; ++i) {
    uint32_t max_inline = 0, send_depth = 0;
    ibv_qp* qp = CreateQueuePair(pd_, cq_, caps, &max_inline, &send_depth);
    if (!qp) return -(errno ? errno : EINVAL);
    (i == 0 ? qp_ : extra_[i - 1]) = qp;
    if (send_depth < kSendDepth) return -ENOSPC;
    if (int rc = InitQueuePair(id_, qp); rc < 0) return rc;
    max_inline_ = i == 0 || max_inline < max_inline_ ? max_inline : max_inline_;
  }
  constexpr size_t kPage = 4096;
  control_ =
      static_cast<uint8_t*>(aligned_alloc(kPage, (kControlBytes + kPage - 1) & ~(kPage - 1)));
  if (!control_) return -ENOMEM;
  std::memset(control_, 0, kControlBytes);
  control_mr_ =
      ibv_reg_mr(pd_, control_, kControlBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!control_mr_) {
    const int err = errno ? errno : ENOMEM;
    LogRegistrationFailure(kControlBytes, err);
    return -err;
  }
  if (receiver_) {
    for (int q = 0; q < queue_pairs; ++q)
      for (uint32_t i = 0; i < kRecvDepth; ++i)
        if (!PostRecv(q)) return -(errno ? errno : EIO);
  }
  return 0;
}

int Endpoint::Ready(const uint32_t* extra_qpn) noexcept {
  if (int rc = ReadyQueuePair(id_, qp_, msg::KeptSetup<MessageSetup>().options->gid_index,
                              IBV_ACCESS_REMOTE_WRITE);
      rc < 0)
    return rc;
  for (int i = 1; i < queue_pairs_; ++i)
    if (int rc =
            ReadyExtraQueuePair(id_, extra_[i - 1], qp_, extra_qpn[i - 1], IBV_ACCESS_REMOTE_WRITE);
        rc < 0)
      return rc;
  return 0;
}

bool Endpoint::PostRecv(int index) noexcept {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.num_sge = 0;  // a WRITE WITH IMMEDIATE consumes a receive and places nothing in it
  return ibv_post_recv(qp(index), &wr, &bad) == 0;
}

Status Endpoint::Register(const msg::Region& region, msg::Memory** out) noexcept {
  *out = nullptr;
  auto* m = new (std::nothrow) VerbsMemory();
  if (!m) return Status::kSystem;
  m->owner = this;
  m->begin = uintptr_t(region.data);
  m->end = m->begin + region.size;
  m->device = region.device;
  if (region.size > 0) {
    // A receiver's buffers are written by its peer, and read by its own flush queue pair
    // (the peer's queue pair has no remote read right); a sender's are read locally only.
    const int access =
        IBV_ACCESS_LOCAL_WRITE | (receiver_ ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ : 0);
    m->mr = region.dmabuf_fd >= 0
                ? ibv_reg_dmabuf_mr(pd_, region.dmabuf_offset, region.size,
                                    uint64_t(uintptr_t(region.data)), region.dmabuf_fd, access)
                : ibv_reg_mr(pd_, region.data, region.size, access);
    if (!m->mr) {
      const int err = errno ? errno : ENOMEM;
      LogRegistrationFailure(region.size, err);
      delete m;
      return Status::kSystem;
    }
  }
  try {
    memory_.push_back(m);
  } catch (...) {
    if (m->mr) ibv_dereg_mr(m->mr);
    delete m;
    return Status::kSystem;
  }
  *out = m;
  return Status::kOk;
}

Status Endpoint::PostFlush(const VerbsMemory* memory, const void* at, uint64_t wr_id) noexcept {
  if (!flush_qp_) {
    flush_qp_ = CreateLoopbackQueuePair(pd_, cq_, qp_, id_->port_num, msg::kMaxRequests);
    if (!flush_qp_) {
      char what[96];
      snprintf(what, sizeof(what), "cannot make the flush queue pair: %s", strerror(errno));
      return Fail(Status::kSystem, what);
    }
  }
  ibv_sge sge{uint64_t(uintptr_t(control_ + kFlushScratchOffset)), 1, control_mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = uint64_t(uintptr_t(at));
  wr.wr.rdma.rkey = memory->mr->rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(flush_qp_, &wr, &bad); rc != 0) {
    char what[96];
    snprintf(what, sizeof(what), "cannot post a flush: %s", strerror(rc));
    return Fail(Status::kSystem, what);
  }
  return Status::kOk;
}

Status Endpoint::Deregister(msg::Memory* memory) noexcept {
  for (size_t i = 0; i < memory_.size(); ++i) {
    if (memory_[i] != memory) continue;
    VerbsMemory* m = memory_[i];
    memory_.erase(memory_.begin() + long(i));
    if (m->mr) ibv_dereg_mr(m->mr);
    m->magic = 0;
    delete m;
    return Status::kOk;
  }
  return Status::kBadArgument;
}

const VerbsMemory* Endpoint::Find(msg::Memory* memory, const void* data,
                                  size_t size) const noexcept {
  // What the face hands back is what Register gave it (NCCL's mhandle): its magic and
  // owner say it is one of ours, for this comm.
  const auto* m = static_cast<const VerbsMemory*>(memory);
  if (m == nullptr || m->magic != VerbsMemory::kMagic || m->owner != this) return nullptr;
  return m->Covers(data, size) && (size == 0 || m->mr) ? m : nullptr;
}

Status Endpoint::CheckEvents() noexcept {
  if (error_ != Status::kOk) return error_;
  const uint64_t now = sys::MonotonicMs();
  if (now < next_event_check_ms_) return Status::kOk;
  next_event_check_ms_ = now + kEventCheckMs;
  rdma_cm_event* event = nullptr;
  while (channel_ && rdma_get_cm_event(channel_, &event) == 0) {
    const rdma_cm_event_type type = event->event;
    rdma_ack_cm_event(event);
    if (type == RDMA_CM_EVENT_DISCONNECTED) {
      peer_gone_ = true;
      return Fail(Status::kRemote, receiver_
                                       ? "the sender closed its end (or died): disconnected"
                                       : "the receiver closed its end (or died): disconnected");
    }
    if (type == RDMA_CM_EVENT_DEVICE_REMOVAL)
      return Fail(Status::kRemote, "the RDMA device was removed");
  }
  return Status::kOk;
}

Status Endpoint::Fail(Status status, const char* what) noexcept {
  if (error_ != Status::kOk) return error_;
  error_ = status;
  SLIP_LOG(kWarn, "verbs: NCCL comm on queue pair %u failed: %s", qp_ ? qp_->qp_num : 0u, what);
  return error_;
}

}  // namespace slip::verbs::msgimpl
