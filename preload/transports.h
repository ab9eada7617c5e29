// The shim's transports: the registry of every transport it was built with
// (BuiltTransports), in the order the user chose (SLIP_TRANSPORTS). The shim names no
// transport: what it asks of one goes through core's Transport.
#pragma once

#include <string>

#include "core/transport.h"

namespace slip::preload {

// Lists the transports and reads their options (at start-up, once). False with *error on
// a bad value.
bool SetUpTransports(const Config& config, std::string* error);
// The chosen transports, in the user's order (empty until SetUpTransports ran).
const TransportRegistry& Transports() noexcept;
// Every listed transport's variable names (for the list of unknown SLIP_* variables).
std::vector<const char*> TransportOptionNames();
// The transport whose libraries hold `code`, the return address of an interposed call
// (Transport::IsLibraryCaller), or null: such calls go to libc untouched (libfabric's tcp
// provider makes, polls and waits on sockets of its own, from inside our calls into it;
// the fabric module's progress thread is not an application thread).
Transport* TransportLibraryCall(const void* code) noexcept;

}  // namespace slip::preload
