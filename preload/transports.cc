#include "preload/transports.h"

#include "core/no_destructor.h"

namespace slip::preload {

namespace {

TransportRegistry& Registry() noexcept {
  static NoDestructor<TransportRegistry> registry;
  return *registry;
}

}  // namespace

bool SetUpTransports(const Config& config, std::string* error) {
  TransportRegistry& r = Registry();
  if (r.known_size() == 0) {
    for (Transport* t : BuiltTransports()) r.Add(t);
  }
  for (size_t i = 0; i < r.known_size(); ++i) {
    if (!r.known(i)->ReadOptions(ProcessEnv, nullptr, error)) return false;
  }
  r.Choose(config.transports);
  return true;
}

const TransportRegistry& Transports() noexcept {
  return Registry();
}

std::vector<const char*> TransportOptionNames() {
  std::vector<const char*> names;
  const TransportRegistry& r = Registry();
  for (size_t i = 0; i < r.known_size(); ++i) {
    for (const char* name : r.known(i)->OptionNames()) names.push_back(name);
  }
  return names;
}

Transport* TransportLibraryCall(const void* code) noexcept {
  return Registry().LibraryOf(code);
}

}  // namespace slip::preload
