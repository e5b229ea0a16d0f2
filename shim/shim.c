#include <string.h>
#include "shim.h"

/* Defines metrale_<name>_initializer(TYPE *out) = MACRO, from a static so that padding is zero too. */
#define METRALE_INITIALIZER(name, type, macro)              \
    void metrale_##name##_initializer(type *out) {          \
        static const type init = macro;                     \
        memcpy(out, &init, sizeof init);                    \
    }

METRALE_INITIALIZER(nccl_config, ncclConfig_t, NCCL_CONFIG_INITIALIZER)
METRALE_INITIALIZER(nccl_sim_info, ncclSimInfo_t, NCCL_SIM_INFO_INITIALIZER)
#ifdef NCCL_COLLCONFIG_INITIALIZER
METRALE_INITIALIZER(nccl_coll_config, ncclCollConfig_t, NCCL_COLLCONFIG_INITIALIZER)
#endif
#ifdef NCCL_ENCRYPTION_CONFIG_INITIALIZER
METRALE_INITIALIZER(nccl_encryption_config, ncclEncryptionConfig_t, NCCL_ENCRYPTION_CONFIG_INITIALIZER)
#endif
