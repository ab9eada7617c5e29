// What slip-stat and slip-run --summary report: processes under Slipstream and their
// connections, read either live from /dev/shm (stats_file.h) or from the exit records of
// SLIP_STATS_FILE (exit_records.h). Plain values: the readers copy everything out of the
// shared mapping, so nothing here changes under the caller.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace slipstat {

struct Connection {
  bool open = false;      // false: closed, still in the table (or the process has exited)
  std::string transport;  // slip::TransportName(): "shm", "tcp", ...
  std::string provider;   // what carries the transport where it says ("tcp;ofi_rxm"), else ""
  std::string reason;     // slip::ReasonName() of a plain connection; "" when accelerated
  std::string local;      // "127.0.0.1:5201", "[::1]:5201"
  std::string remote;
  int role = -1;  // 0 connected, 1 accepted; -1 unknown (exit records do not say)
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t msgs_sent = 0;  // the message counts and times are 0 where unknown
  uint64_t msgs_received = 0;
  uint64_t opened_ns = 0;  // CLOCK_REALTIME
  uint64_t closed_ns = 0;
};

struct Process {
  pid_t pid = 0;
  std::string exe;
  uint64_t dropped = 0;  // connections the table could not record (full)
  // By slip::Reason: connections opened with each reason and later changes to it, since the
  // process started. Empty when not known (exit records).
  std::vector<uint64_t> reason_counts;
  std::vector<Connection> connections;
};

}  // namespace slipstat
