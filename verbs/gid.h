// Which source GID a RoCE queue pair uses.
//
// rdma_cm derives the GID from the bound IP address; on RoCE one address has a GID per
// RoCE version, and version 2 (routable UDP/IP encapsulation) is what routed datacenter
// fabrics need. ChooseSourceGid keeps rdma_cm's choice when it is RoCE v2 (or InfiniBand),
// moves to the RoCE v2 entry of the same address when rdma_cm picked v1, and honours an
// explicit SLIP_GID_INDEX, which must name an entry of the port's table.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace slip::verbs {

// Returns the GID index to use, or -ENOENT (logged once per call) when `override` (>= 0)
// names no GID of the port.
int ChooseSourceGid(ibv_context* context, uint8_t port, uint8_t cm_index, int override) noexcept;

// "RoCE v2", "RoCE v1", "IB", for the logs.
const char* GidTypeName(ibv_context* context, uint8_t port, uint8_t index) noexcept;

}  // namespace slip::verbs
