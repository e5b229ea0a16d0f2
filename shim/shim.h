/* What bindgen cannot translate from nccl.h, as C it can: translated with the headers (wrapper.h). The
 * initializer macros are shim.c's, one function each, which src/initializers.rs declares itself: the
 * build script generates both sides from the macros the preprocessor finds. */
#ifndef METRALE_SHIM_H
#define METRALE_SHIM_H
#include <nccl.h>

/* Macros bindgen's preprocessor cannot evaluate (INT_MIN comes from limits.h), as constants clang evaluates. */
static const int METRALE_NCCL_CONFIG_UNDEF_INT = NCCL_CONFIG_UNDEF_INT;

#endif
