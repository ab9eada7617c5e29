#include "verbs/gid.h"

#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace slip::verbs {

namespace {

bool Query(ibv_context* context, uint8_t port, uint32_t index, ibv_gid_entry* entry) noexcept {
  if (ibv_query_gid_ex(context, port, index, entry, 0) != 0) return false;
  static const uint8_t kZero[16] = {};
  return std::memcmp(entry->gid.raw, kZero, sizeof(kZero)) != 0;
}

}  // namespace

const char* GidTypeName(ibv_context* context, uint8_t port, uint8_t index) noexcept {
  ibv_gid_entry entry{};
  if (!Query(context, port, index, &entry)) return "none";
  switch (entry.gid_type) {
    case IBV_GID_TYPE_IB:
      return "IB";
    case IBV_GID_TYPE_ROCE_V1:
      return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2:
      return "RoCE v2";
  }
  return "?";
}

int ChooseSourceGid(ibv_context* context, uint8_t port, uint8_t cm_index, int override) noexcept {
  ibv_gid_entry entry{};
  if (override >= 0) {
    if (Query(context, port, uint32_t(override), &entry)) return override;
    SLIP_LOG(kError, "verbs: SLIP_GID_INDEX=%d: %s port %u has no such GID; not using RDMA",
             override, ibv_get_device_name(context->device), unsigned(port));
    return -ENOENT;
  }
  if (!Query(context, port, cm_index, &entry) || entry.gid_type != IBV_GID_TYPE_ROCE_V1)
    return cm_index;
  // rdma_cm chose RoCE v1: the same address's v2 entry, if the port has one.
  const ibv_gid gid = entry.gid;
  ibv_port_attr attr{};
  if (ibv_query_port(context, port, &attr) != 0) return cm_index;
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    if (Query(context, port, uint32_t(i), &entry) && entry.gid_type == IBV_GID_TYPE_ROCE_V2 &&
        std::memcmp(entry.gid.raw, gid.raw, sizeof(gid.raw)) == 0)
      return i;
  }
  return cm_index;
}

}  // namespace slip::verbs
