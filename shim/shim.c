#include <string.h>
#include "shim.h"

void metrale_nccl_config_initializer(ncclConfig_t *out) {
    static const ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    memcpy(out, &init, sizeof init);
}

void metrale_nccl_sim_info_initializer(ncclSimInfo_t *out) {
    static const ncclSimInfo_t init = NCCL_SIM_INFO_INITIALIZER;
    memcpy(out, &init, sizeof init);
}
