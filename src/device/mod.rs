//! NCCL's device API (NCCL 2.28+, `nccl_device.h`): kernels that communicate by themselves. On the host a
//! communicator gets a device communicator ([`DevComm`], `ncclDevCommCreate`) and symmetric windows over
//! its buffers ([`Window`], `ncclCommWindowRegister`); a kernel of one's own takes both by value and reaches
//! its peers' memory (LSA pointers), barriers, multimem and GIN through the header's device functions.
//! Building such a kernel and launching it from Rust: `docs/device-api.md` and [`crate::cuda::Module`].
//!
//! The raw functions and types (`ncclDevCommCreate`, `ncclDevComm`, `ncclTeamLsa`, …) are
//! [`bindings`](crate::bindings)' own, translated from the installed header like nccl.h's and loaded per
//! symbol. The helpers here remove the footguns, nothing more:
//! - [`require_device_api`]: a communicator without device API support, or with more LSA teams than a
//!   kernel handles, is [`GpuError::DeviceApiUnsupported`] saying which (NCCL 2.29+ asks
//!   `query_properties`: `ncclCommQueryProperties` with `NCCL_COMM_PROPERTIES_INITIALIZER` filled in).
//! - [`requirements`]: `ncclDevCommRequirements_t` as the headers start one (their initializer, 2.29+;
//!   zeroed before, as NCCL 2.28's examples do).
//! - [`Window`]: a registered window, deregistered when dropped, on every path.
//! - [`DevComm`]: a device communicator, destroyed when dropped, on every path.
//!
//! Registration, deregistration and the device communicator's creation and destruction are collective:
//! every rank of the communicator makes the same calls in the same order. A rank that drops a window or
//! device communicator early (an error path) leaves the others waiting in theirs until the communicator
//! is aborted.
//!
//! [`GpuError::DeviceApiUnsupported`]: crate::nccl::GpuError::DeviceApiUnsupported

mod dev_comm;
mod properties;
mod window;

pub use dev_comm::{requirements, DevComm};
// ncclCommQueryProperties and its initializer came together (NCCL 2.29).
#[cfg(nccl_macro = "NCCL_COMM_PROPERTIES_INITIALIZER")]
pub use properties::query_properties;
pub use properties::require_device_api;
pub use window::Window;
