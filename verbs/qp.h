// The queue-pair layer every verbs connection uses, whichever face it serves (the shim's
// streams, verbs/conn.h; the NCCL face's message comms, verbs/msg.h): a reliable-connected
// queue pair of our own (not rdma_cm's, so that we choose its source GID), moved through
// its states with what rdma_cm's exchange settled.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>

namespace slip::verbs {

// 4.096 us << 18: about a second per try, NCCL's order of magnitude. A peer queue pair that
// stops answering ends in a completion error (retry exceeded), never in an endless wait.
constexpr uint8_t kTransportTimeout = 18;

struct QueuePairCaps {
  uint32_t send_depth = 0;
  uint32_t recv_depth = 0;
  uint32_t inline_wanted = 0;  // settled down to 64, then 16, then what the device gives
};

// An RC queue pair in `pd`, both directions completing to `cq`, one scatter/gather entry
// per request. *max_inline and *send_depth say what the device granted. nullptr with errno.
ibv_qp* CreateQueuePair(ibv_pd* pd, ibv_cq* cq, const QueuePairCaps& caps, uint32_t* max_inline,
                        uint32_t* send_depth) noexcept;

// INIT, so that receives can be posted before the exchange completes. 0 or -errno.
int InitQueuePair(rdma_cm_id* id, ibv_qp* qp) noexcept;

// INIT again with the rights the exchange settled plus `access` (IBV_ACCESS_REMOTE_*),
// RTR with the source GID ChooseSourceGid picks (`gid_override`: SLIP_GID_INDEX or -1),
// and RTS with a bounded transport timeout. 0 or -errno.
int ReadyQueuePair(rdma_cm_id* id, ibv_qp* qp, int gid_override, int access) noexcept;

// The same for another queue pair on `id`'s path (its INIT done with InitQueuePair): the
// source GID of `like` (the id's own queue pair, ready), the peer's queue pair `dest_qpn`,
// the starting sequence numbers rdma_cm settled for the id (both ends use the id's for
// their extra queue pairs, so they agree). 0 or -errno.
int ReadyExtraQueuePair(rdma_cm_id* id, ibv_qp* qp, ibv_qp* like, uint32_t dest_qpn,
                        int access) noexcept;

// A queue pair connected to itself along `path`'s route (its port, MTU and source GID),
// for RDMA READs of our own memory: a NIC's writes into GPU memory are flushed by a read
// through the NIC (NCCL's GPUDirect flush). Remote reads allowed, nothing else. nullptr with
// errno.
ibv_qp* CreateLoopbackQueuePair(ibv_pd* pd, ibv_cq* cq, ibv_qp* path, uint8_t port,
                                uint32_t depth) noexcept;

// The rdma_cm parameters of a REQ or REP: `data` (`len` bytes, 0 when it did not encode)
// as private data, our own queue pair, the transport's retries at their maximum (a lost
// packet is retried by the device, not noticed above it).
inline rdma_conn_param ConnParam(const uint8_t* data, size_t len, uint32_t qp_num) noexcept {
  rdma_conn_param param{};
  param.private_data = data;
  param.private_data_len = uint8_t(len);
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  param.qp_num = qp_num;
  return param;
}

}  // namespace slip::verbs
