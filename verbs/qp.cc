#include "verbs/qp.h"

#include <cerrno>

#include "core/log.h"
#include "verbs/gid.h"

namespace slip::verbs {

ibv_qp* CreateQueuePair(ibv_pd* pd, ibv_cq* cq, const QueuePairCaps& caps, uint32_t* max_inline,
                        uint32_t* send_depth) noexcept {
  ibv_qp_init_attr attr{};
  attr.send_cq = cq;
  attr.recv_cq = cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  // Devices differ in how much they inline; ask for plenty, settle for what they give.
  for (uint32_t want : {caps.inline_wanted, 64u, 16u, 0u}) {
    if (want > caps.inline_wanted) continue;
    attr.cap.max_inline_data = want;
    attr.cap.max_send_wr = caps.send_depth;
    attr.cap.max_recv_wr = caps.recv_depth;
    if (ibv_qp* qp = ibv_create_qp(pd, &attr)) {
      *max_inline = attr.cap.max_inline_data;
      *send_depth = attr.cap.max_send_wr < caps.send_depth ? attr.cap.max_send_wr : caps.send_depth;
      return qp;
    }
  }
  return nullptr;
}

int InitQueuePair(rdma_cm_id* id, ibv_qp* qp) noexcept {
  ibv_qp_attr init{};
  int mask = 0;
  init.qp_state = IBV_QPS_INIT;
  if (rdma_init_qp_attr(id, &init, &mask) != 0) return -(errno ? errno : EINVAL);
  if (ibv_modify_qp(qp, &init, mask) != 0) return -(errno ? errno : EINVAL);
  return 0;
}

namespace {

// INIT with the exchange's rights plus `access`, RTR, RTS, with what rdma_cm settled for
// `id`; `like` (another queue pair of the id, already ready) gives the source GID and
// `dest_qpn` the peer's queue pair, for a second queue pair on the same path.
int Ready(rdma_cm_id* id, ibv_qp* qp, int gid_override, int access, ibv_qp* like,
          uint32_t dest_qpn) noexcept {
  // INIT again, now with what the connection exchange settled (access rights: before it,
  // rdma_cm grants none), as librdmacm does for the queue pairs it manages.
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = IBV_QPS_INIT;
  if (rdma_init_qp_attr(id, &attr, &mask) != 0) return -(errno ? errno : EINVAL);
  attr.qp_access_flags |= unsigned(access);
  mask |= IBV_QP_ACCESS_FLAGS;
  if (ibv_modify_qp(qp, &attr, mask) != 0) return -(errno ? errno : EINVAL);
  attr = ibv_qp_attr{};
  mask = 0;
  attr.qp_state = IBV_QPS_RTR;
  if (rdma_init_qp_attr(id, &attr, &mask) != 0) return -(errno ? errno : EINVAL);
  if (like != nullptr) {
    attr.dest_qp_num = dest_qpn;
    ibv_qp_attr path{};
    ibv_qp_init_attr unused{};
    if (attr.ah_attr.is_global) {
      if (ibv_query_qp(like, &path, IBV_QP_AV, &unused) != 0) return -(errno ? errno : EINVAL);
      attr.ah_attr.grh.sgid_index = path.ah_attr.grh.sgid_index;
    }
  } else if (attr.ah_attr.is_global) {
    const uint8_t port = attr.ah_attr.port_num ? attr.ah_attr.port_num : id->port_num;
    int index = ChooseSourceGid(id->verbs, port, attr.ah_attr.grh.sgid_index, gid_override);
    if (index < 0) return index;
    if (index != attr.ah_attr.grh.sgid_index)
      SLIP_LOG(kDebug, "verbs: source GID index %d instead of rdma_cm's %u", index,
               unsigned(attr.ah_attr.grh.sgid_index));
    attr.ah_attr.grh.sgid_index = uint8_t(index);
    SLIP_LOG(kDebug, "verbs: queue pair %u: source GID index %d (%s)", qp->qp_num, index,
             GidTypeName(id->verbs, port, uint8_t(index)));
  }
  if (ibv_modify_qp(qp, &attr, mask) != 0) return -(errno ? errno : EINVAL);
  attr = ibv_qp_attr{};
  mask = 0;
  attr.qp_state = IBV_QPS_RTS;
  if (rdma_init_qp_attr(id, &attr, &mask) != 0) return -(errno ? errno : EINVAL);
  if (!(mask & IBV_QP_TIMEOUT) || attr.timeout == 0) {
    attr.timeout = kTransportTimeout;
    mask |= IBV_QP_TIMEOUT;
  }
  SLIP_LOG(kDebug, "verbs: queue pair %u: transport timeout %u, retries %u, rnr retries %u",
           qp->qp_num, unsigned(attr.timeout), unsigned(attr.retry_cnt), unsigned(attr.rnr_retry));
  if (ibv_modify_qp(qp, &attr, mask) != 0) return -(errno ? errno : EINVAL);
  return 0;
}

}  // namespace

int ReadyQueuePair(rdma_cm_id* id, ibv_qp* qp, int gid_override, int access) noexcept {
  return Ready(id, qp, gid_override, access, nullptr, 0);
}

int ReadyExtraQueuePair(rdma_cm_id* id, ibv_qp* qp, ibv_qp* like, uint32_t dest_qpn,
                        int access) noexcept {
  return Ready(id, qp, -1, access, like, dest_qpn);
}

ibv_qp* CreateLoopbackQueuePair(ibv_pd* pd, ibv_cq* cq, ibv_qp* path, uint8_t port,
                                uint32_t depth) noexcept {
  ibv_qp_attr like{};
  ibv_qp_init_attr like_init{};
  if (ibv_query_qp(path, &like, IBV_QP_AV | IBV_QP_PATH_MTU, &like_init) != 0) return nullptr;
  ibv_port_attr port_attr{};
  if (ibv_query_port(pd->context, port, &port_attr) != 0) return nullptr;
  QueuePairCaps caps;
  caps.send_depth = depth;
  caps.recv_depth = 1;
  uint32_t max_inline = 0, send_depth = 0;
  ibv_qp* qp = CreateQueuePair(pd, cq, caps, &max_inline, &send_depth);
  if (!qp) return nullptr;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_READ;
  bool ok = ibv_modify_qp(
                qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0;
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = like.path_mtu;
  a.dest_qp_num = qp->qp_num;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr = like.ah_attr;  // the route out, turned back to ourselves
  a.ah_attr.port_num = port;
  a.ah_attr.dlid = port_attr.lid;
  if (like.ah_attr.is_global &&
      ibv_query_gid(pd->context, port, like.ah_attr.grh.sgid_index, &a.ah_attr.grh.dgid) != 0)
    ok = false;
  ok = ok &&
       ibv_modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0;
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = kTransportTimeout;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  ok = ok && ibv_modify_qp(qp, &a,
                           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                               IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0;
  if (!ok) {
    const int err = errno;
    ibv_destroy_qp(qp);
    errno = err;
    return nullptr;
  }
  return qp;
}

}  // namespace slip::verbs
