// A fake environment for the option parsers' tests (core/options.h, EnvLookup): a map of
// variables, and the lookup that reads it (`ctx` is the map).
#pragma once

#include <map>
#include <string>

namespace slip::testing_env {

using Env = std::map<std::string, std::string>;

inline const char* Lookup(const char* name, void* ctx) {
  auto* env = static_cast<Env*>(ctx);
  auto it = env->find(name);
  return it == env->end() ? nullptr : it->second.c_str();
}

}  // namespace slip::testing_env
