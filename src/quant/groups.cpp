#include "quant/groups.h"

#include "quant/iq_tables.h"

namespace glm5::quant::groups {

Tables host_tables() {
    Tables t;
    t.iq2xxs = iq::iq2xxs_grid;
    t.iq2xs = iq::iq2xs_grid;
    t.iq2s = iq::iq2s_grid;
    t.iq3xxs = iq::iq3xxs_grid;
    t.iq3s = iq::iq3s_grid;
    t.iq1s = iq::iq1s_grid;
    t.ksigns = iq::ksigns_iq2xs;
    t.kvalues = iq::kvalues_iq4nl;
    return t;
}

}  // namespace glm5::quant::groups
