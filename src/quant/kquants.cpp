// Placeholder: this family's formats are not implemented yet.
#include "quant/ops.h"

namespace glm5::quant {
const FormatOps* kquant_ops(Type) { return nullptr; }
}  // namespace glm5::quant
