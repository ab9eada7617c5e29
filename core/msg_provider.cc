#include "core/msg_provider.h"

namespace slip::msg {

const void* ModuleAnchor() noexcept {
  return reinterpret_cast<const void*>(&ModuleAnchor);
}

}  // namespace slip::msg
