/* What bindgen cannot translate: NCCL's initializer macros. Each function copies the macro's value, as the
 * installed nccl.h defines it, into *out (padding included, since the source object is static). */
#ifndef METRALE_SHIM_H
#define METRALE_SHIM_H
#include <nccl.h>

/* Macros bindgen's preprocessor cannot evaluate (INT_MIN comes from limits.h), as constants clang evaluates. */
static const int METRALE_NCCL_CONFIG_UNDEF_INT = NCCL_CONFIG_UNDEF_INT;

/* *out = NCCL_CONFIG_INITIALIZER */
void metrale_nccl_config_initializer(ncclConfig_t *out);
/* *out = NCCL_SIM_INFO_INITIALIZER */
void metrale_nccl_sim_info_initializer(ncclSimInfo_t *out);

#endif
