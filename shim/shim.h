/* What bindgen cannot translate: NCCL's initializer macros. Each function copies the macro's value, as the
 * installed nccl.h defines it, into *out (padding included, since the source object is static). A function
 * exists only where the installed nccl.h defines its macro, so bindgen generates exactly those. */
#ifndef METRALE_SHIM_H
#define METRALE_SHIM_H
#include <nccl.h>

/* Macros bindgen's preprocessor cannot evaluate (INT_MIN comes from limits.h), as constants clang evaluates. */
static const int METRALE_NCCL_CONFIG_UNDEF_INT = NCCL_CONFIG_UNDEF_INT;

/* *out = NCCL_CONFIG_INITIALIZER */
void metrale_nccl_config_initializer(ncclConfig_t *out);
/* *out = NCCL_SIM_INFO_INITIALIZER */
void metrale_nccl_sim_info_initializer(ncclSimInfo_t *out);
#ifdef NCCL_COLLCONFIG_INITIALIZER
/* *out = NCCL_COLLCONFIG_INITIALIZER (NCCL 2.32+) */
void metrale_nccl_coll_config_initializer(ncclCollConfig_t *out);
#endif
#ifdef NCCL_ENCRYPTION_CONFIG_INITIALIZER
/* *out = NCCL_ENCRYPTION_CONFIG_INITIALIZER (NCCL 2.32+) */
void metrale_nccl_encryption_config_initializer(ncclEncryptionConfig_t *out);
#endif

#endif
