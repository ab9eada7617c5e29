// What shm's message listener (msg_connect.cc) and its comms (msg_comm.cc) share.
#pragma once

#include <cstdint>
#include <memory>

#include "core/msg_comm.h"

namespace slip::shm {

// A comm over a mapped, validated region (taken: unmapped when the comm goes) and the
// connected rendezvous socket (taken). nullptr when out of memory (the caller keeps both).
std::unique_ptr<msg::SendComm> MakeSendComm(void* region, uint32_t ring_size, int sock) noexcept;
std::unique_ptr<msg::RecvComm> MakeRecvComm(void* region, uint32_t ring_size, int sock) noexcept;

}  // namespace slip::shm
