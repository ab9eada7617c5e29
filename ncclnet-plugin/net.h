// The NCCL face, independent of the ABI version: every ncclNet_vN table (tables.cc) is a
// thin adapter over these functions, which drive the transports' message comms
// (core/msg_comm.h). docs/DESIGN.md, "The NCCL face".
//
// What NCCL hands back to us (comm pointers, request pointers, handles) is checked before
// use where a mistake would otherwise be undefined behaviour: comms are looked up in the
// table of live ones on close and registration (a double close is an error, not a crash),
// and handles are parsed by the transport that made them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ncclnet-plugin/nccl_abi.h"

namespace slip::nccl {

constexpr const char* kPluginName = "Slipstream";

// Version-neutral properties; each table copies what its version has.
struct Properties {
  const char* name = nullptr;
  const char* pci_path = nullptr;
  uint64_t guid = 0;
  int ptr_support = NCCL_PTR_HOST;
  int reg_is_global = 0;
  int force_flush = 0;
  int speed_mbps = 0;
  int port = 1;
  float latency_us = 0;
  int max_comms = 0;
  int max_recvs = 0;
  ncclNetVDeviceProps_v9_t vprops{};
  size_t max_p2p_bytes = 0;
  size_t max_coll_bytes = 0;
};

ncclResult_t Init(ncclDebugLogger_t logger) noexcept;
ncclResult_t Devices(int* ndev) noexcept;
ncclResult_t GetProperties(int dev, Properties* props) noexcept;
ncclResult_t MakeVDevice(int* dev, ncclNetVDeviceProps_v9_t* props) noexcept;
ncclResult_t Listen(int dev, void* handle, void** listen_comm) noexcept;
ncclResult_t Connect(int dev, void* handle, void** send_comm,
                     ncclNetDeviceHandle_v8_t** send_dev_comm) noexcept;
ncclResult_t Accept(void* listen_comm, void** recv_comm,
                    ncclNetDeviceHandle_v8_t** recv_dev_comm) noexcept;
ncclResult_t RegMr(void* comm, void* data, size_t size, int type, void** mhandle) noexcept;
ncclResult_t RegMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                         void** mhandle) noexcept;
ncclResult_t DeregMr(void* comm, void* mhandle) noexcept;
ncclResult_t Isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                   void** request) noexcept;
ncclResult_t Irecv(void* recv_comm, int n, void** data, const size_t* sizes, int* tags,
                   void** mhandles, void** request) noexcept;
ncclResult_t Iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                    void** request) noexcept;
ncclResult_t Test(void* request, int* done, int* sizes) noexcept;
ncclResult_t CloseSend(void* send_comm) noexcept;
ncclResult_t CloseRecv(void* recv_comm) noexcept;
ncclResult_t CloseListen(void* listen_comm) noexcept;

}  // namespace slip::nccl
