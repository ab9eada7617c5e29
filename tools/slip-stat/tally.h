// Connections counted by transport and by fallback reason, with their bytes: the totals of
// slip-stat --reasons and of slip-run --summary.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "tools/slip-stat/model.h"

namespace slipstat {

struct Tally {
  uint64_t connections = 0;
  std::map<std::string, uint64_t> transports;  // connections by transport name
  std::map<std::string, uint64_t> reasons;     // plain connections by reason name
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;

  void Add(const Connection& c);
  void Add(const Process& p);  // every connection of p
};

// "2 connections: 1 shm, 1 tcp (1 peer_not_slipstream); 1.5 KiB sent, 1.5 KiB received",
// with `one` and `many` naming what is counted.
std::string Describe(const Tally& tally, std::string_view one = "connection",
                     std::string_view many = "connections");

}  // namespace slipstat
