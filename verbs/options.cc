#include "verbs/options.h"

namespace slip::verbs {

namespace {

using options::ParseRange;

bool ParseNotify(std::string_view v, Options* o, std::string*) {
  static constexpr std::pair<const char*, NotifyMode> kWords[] = {
      {"auto", NotifyMode::kAuto}, {"imm", NotifyMode::kImm}, {"send", NotifyMode::kSend}};
  for (const auto& [word, mode] : kWords) {
    if (options::IEquals(v, word)) {
      o->notify = mode;
      return true;
    }
  }
  return false;
}

constexpr options::Option<Options> kOptions[] = {
    {"SLIP_DEVICE", "expected an RDMA device name (e.g. rxe0)",
     [](std::string_view v, Options* o, std::string*) {
       if (!options::IsDeviceName(v)) return false;
       o->device = v;
       return true;
     }},
    {"SLIP_GID_INDEX", "expected a GID table index between 0 and 255",
     [](std::string_view v, Options* o, std::string*) {
       uint32_t index;
       if (!ParseRange(v, 0, 255, &index)) return false;
       o->gid_index = int(index);
       return true;
     }},
    {"SLIP_VERBS_NOTIFY", "expected auto, imm or send", ParseNotify},
    {"SLIP_NEGATIVE_TTL_MS", "expected a decimal integer between 0 and 3600000",
     [](std::string_view v, Options* o, std::string*) {
       return ParseRange(v, 0, 3600000, &o->negative_ttl_ms);
     }},
    {"SLIP_VERBS_REUSE", "expected a decimal integer between 0 and 1024",
     [](std::string_view v, Options* o, std::string*) {
       return ParseRange(v, 0, 1024, &o->reuse);
     }},
    {"SLIP_VERBS_PIN_MAX", "expected a size between 1M and 1024G (e.g. 512M)",
     [](std::string_view v, Options* o, std::string*) {
       uint64_t size;
       if (!options::ParseSize(v, &size) || size < (uint64_t(1) << 20) ||
           size > (uint64_t(1) << 40))
         return false;
       o->pin_max = size;
       return true;
     }},
};

}  // namespace

constinit const options::Table<Options> kOptionTable(kOptions);

}  // namespace slip::verbs
