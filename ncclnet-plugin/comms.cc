// The NCCL face's comms: listen, connect, accept, send, receive, flush, test and close,
// over the message comms of the transport under each device.
#include <climits>
#include <cstring>
#include <memory>
#include <new>

#include "core/log.h"
#include "ncclnet-plugin/face.h"

namespace slip::nccl {

namespace {

using msg::Status;

bool Track(const FaceComm* comm) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  try {
    s.live.insert(comm);
  } catch (...) {
    return false;
  }
  return true;
}

// Takes `comm` out of the live table if it is a live comm of `kind`.
bool Untrack(const void* comm, CommKind kind) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.live.find(comm);
  if (it == s.live.end() || static_cast<const FaceComm*>(comm)->kind != kind) return false;
  s.live.erase(it);
  return true;
}

template <typename T>
ncclResult_t Close(void* comm, CommKind kind, const char* what) noexcept {
  if (comm == nullptr || !Untrack(comm, kind)) {
    SLIP_LOG(kWarn, "%s of %p: not a live comm of ours (closed twice?): refused", what, comm);
    return ncclInvalidArgument;
  }
  delete static_cast<T*>(comm);  // requests in flight go with it
  return ncclSuccess;
}

}  // namespace

bool IsLive(const void* comm) noexcept {
  State& s = S();
  std::lock_guard lock(s.mu);
  return s.live.count(comm) != 0;
}

ncclResult_t Listen(int dev, void* handle, void** listen_comm) noexcept {
  *listen_comm = nullptr;
  int ndev = 0;
  Devices(&ndev);
  if (dev < 0 || dev >= ndev || handle == nullptr) return ncclInvalidArgument;
  auto comm = std::unique_ptr<ListenComm>(new (std::nothrow) ListenComm());
  if (!comm) return ncclSystemError;
  std::memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  comm->dev = dev;
  if (Status st = TransportOf(dev)->Listen(static_cast<uint8_t*>(handle), &comm->listener);
      st != Status::kOk)
    return ToNccl(st) == ncclSuccess ? ncclSystemError : ToNccl(st);
  if (!Track(comm.get())) return ncclSystemError;
  *listen_comm = comm.release();
  return ncclSuccess;
}

ncclResult_t Connect(int dev, void* handle, void** send_comm,
                     ncclNetDeviceHandle_v8_t** send_dev_comm) noexcept {
  (void)send_dev_comm;  // no device offload
  *send_comm = nullptr;
  int ndev = 0;
  Devices(&ndev);
  if (dev < 0 || dev >= ndev || handle == nullptr) return ncclInvalidArgument;
  std::unique_ptr<msg::SendComm> conn;
  const Status st = TransportOf(dev)->Connect(static_cast<const uint8_t*>(handle), &conn);
  if (st == Status::kAgain) return ncclSuccess;  // NCCL calls again
  if (st != Status::kOk) return ToNccl(st);
  auto comm = std::unique_ptr<SendComm>(new (std::nothrow) SendComm());
  if (!comm) return ncclSystemError;
  comm->comm = std::move(conn);
  comm->dev = dev;
  if (!Track(comm.get())) return ncclSystemError;
  *send_comm = comm.release();
  return ncclSuccess;
}

ncclResult_t Accept(void* listen_comm, void** recv_comm,
                    ncclNetDeviceHandle_v8_t** recv_dev_comm) noexcept {
  (void)recv_dev_comm;
  *recv_comm = nullptr;
  if (listen_comm == nullptr || !IsLive(listen_comm) ||
      static_cast<FaceComm*>(listen_comm)->kind != CommKind::kListen)
    return ncclInvalidArgument;
  std::unique_ptr<msg::RecvComm> conn;
  const Status st = static_cast<ListenComm*>(listen_comm)->listener->Accept(&conn);
  if (st == Status::kAgain) return ncclSuccess;
  if (st != Status::kOk) return ToNccl(st);
  auto comm = std::unique_ptr<RecvComm>(new (std::nothrow) RecvComm());
  if (!comm) return ncclSystemError;
  comm->comm = std::move(conn);
  comm->dev = static_cast<ListenComm*>(listen_comm)->dev;
  if (!Track(comm.get())) return ncclSystemError;
  *recv_comm = comm.release();
  return ncclSuccess;
}

ncclResult_t Isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                   void** request) noexcept {
  *request = nullptr;
  auto* comm = static_cast<SendComm*>(send_comm);
  if (comm == nullptr || comm->kind != CommKind::kSend) return ncclInvalidArgument;
  msg::Request* r = nullptr;
  const Status st = comm->comm->Send(data, size, tag, MemoryOf(mhandle), &r);
  *request = r;
  return ToNccl(st);
}

ncclResult_t Irecv(void* recv_comm, int n, void** data, const size_t* sizes, int* tags,
                   void** mhandles, void** request) noexcept {
  // (*request may hold NCCL_NET_OPTIONAL_RECV_COMPLETION: a hint we need not take; the
  // receive completes through test() either way.)
  *request = nullptr;
  auto* comm = static_cast<RecvComm*>(recv_comm);
  if (comm == nullptr || comm->kind != CommKind::kRecv) return ncclInvalidArgument;
  if (n < 1 || n > msg::kMaxGroup) return ncclInvalidArgument;
  msg::Memory* memory[msg::kMaxGroup] = {};
  for (int i = 0; i < n; ++i) memory[i] = mhandles ? MemoryOf(mhandles[i]) : nullptr;
  msg::Request* r = nullptr;
  const Status st = comm->comm->Recv(n, data, sizes, tags, memory, &r);
  *request = r;
  return ToNccl(st);
}

ncclResult_t Iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                    void** request) noexcept {
  *request = nullptr;
  auto* comm = static_cast<RecvComm*>(recv_comm);
  if (comm == nullptr || comm->kind != CommKind::kRecv || n < 1 || n > msg::kMaxGroup)
    return ncclInvalidArgument;
  // Host memory the CPU reads needs nothing (shm's own copies, or a NIC's writes, which
  // are coherent with the CPU); the transport flushes GPU memory.
  msg::Memory* memory[msg::kMaxGroup] = {};
  size_t lengths[msg::kMaxGroup] = {};
  for (int i = 0; i < n; ++i) {
    memory[i] = mhandles ? MemoryOf(mhandles[i]) : nullptr;
    lengths[i] = sizes && sizes[i] > 0 ? size_t(sizes[i]) : 0;
  }
  msg::Request* r = nullptr;
  const Status st = comm->comm->Flush(n, data, lengths, memory, &r);
  *request = r;
  return ToNccl(st);
}

ncclResult_t Test(void* request, int* done, int* sizes) noexcept {
  *done = 0;
  if (request == nullptr) return ncclInvalidArgument;
  bool finished = false;
  size_t got[msg::kMaxGroup];
  int count = 0;
  const Status st = msg::Test(static_cast<msg::Request*>(request), &finished, got, &count);
  if (st != Status::kOk) return ToNccl(st) == ncclSuccess ? ncclInternalError : ToNccl(st);
  if (finished) {
    *done = 1;
    if (sizes != nullptr)
      for (int i = 0; i < count; ++i) sizes[i] = got[i] > size_t(INT_MAX) ? INT_MAX : int(got[i]);
  }
  return ncclSuccess;
}

ncclResult_t CloseSend(void* send_comm) noexcept {
  return Close<SendComm>(send_comm, CommKind::kSend, "closeSend");
}

ncclResult_t CloseRecv(void* recv_comm) noexcept {
  return Close<RecvComm>(recv_comm, CommKind::kRecv, "closeRecv");
}

ncclResult_t CloseListen(void* listen_comm) noexcept {
  return Close<ListenComm>(listen_comm, CommKind::kListen, "closeListen");
}

}  // namespace slip::nccl
