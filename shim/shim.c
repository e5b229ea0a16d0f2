#include <string.h>
#include "shim.h"

/* With `bundled-bindings` the Rust side is the committed snapshot, not a translation of these headers: the
 * build script passes the size of each struct's Rust type (0 where the snapshot has none), and a struct of
 * another size here stops the build instead of being written past its Rust end. */
#ifdef METRALE_BUNDLED_BINDINGS
#define METRALE_SAME_SIZE_AS_SNAPSHOT(type)                                                       \
    _Static_assert(sizeof(type) == METRALE_SNAPSHOT_SIZEOF_##type,                                \
                   "bundled-bindings: sizeof(" #type ") in the headers found differs from the size " \
                   "of the bundled snapshot's Rust type");
#else
#define METRALE_SAME_SIZE_AS_SNAPSHOT(type)
#endif

/* Defines metrale_<name>_initializer(TYPE *out) = MACRO, from a static so that padding is zero too. */
#define METRALE_INITIALIZER(name, type, macro)              \
    METRALE_SAME_SIZE_AS_SNAPSHOT(type)                     \
    void metrale_##name##_initializer(type *out) {          \
        static const type init = macro;                     \
        memcpy(out, &init, sizeof init);                    \
    }

METRALE_INITIALIZER(nccl_config, ncclConfig_t, NCCL_CONFIG_INITIALIZER)
METRALE_INITIALIZER(nccl_sim_info, ncclSimInfo_t, NCCL_SIM_INFO_INITIALIZER)
#ifdef NCCL_COLLCONFIG_INITIALIZER
METRALE_INITIALIZER(nccl_coll_config, ncclCollConfig_t, NCCL_COLLCONFIG_INITIALIZER)
#elif METRALE_SNAPSHOT_SIZEOF_ncclCollConfig_t
#error "bundled-bindings: the bundled snapshot declares ncclCollConfig_t, which the headers found lack"
#endif
#ifdef NCCL_ENCRYPTION_CONFIG_INITIALIZER
METRALE_INITIALIZER(nccl_encryption_config, ncclEncryptionConfig_t, NCCL_ENCRYPTION_CONFIG_INITIALIZER)
#elif METRALE_SNAPSHOT_SIZEOF_ncclEncryptionConfig_t
#error "bundled-bindings: the bundled snapshot declares ncclEncryptionConfig_t, which the headers found lack"
#endif
