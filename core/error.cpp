#include "opguard/core/error.h"

#include <string>

namespace opguard {

void internal_check_failed(const char* expr, const char* file, int line) {
  throw InternalError(std::string("internal check failed: ") + expr + " at " + file + ":" +
                      std::to_string(line) + "; this is a bug in opguard, please report it");
}

}  // namespace opguard
