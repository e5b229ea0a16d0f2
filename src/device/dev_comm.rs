//! [`DevComm`]: a device communicator (`ncclDevCommCreate`), destroyed when dropped.

use crate::bindings::{
    ncclComm_t, ncclDevCommCreate, ncclDevCommDestroy, ncclDevCommRequirements_t, ncclDevComm_t,
};
use crate::check::check_nccl;
use crate::error::GpuError;

/// `ncclDevCommRequirements_t` as the headers start one: `NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER` where
/// they define it (2.29+: its size, magic and version are what NCCL checks); before, all zero, as NCCL
/// 2.28's own examples start it.
pub fn requirements() -> ncclDevCommRequirements_t {
    #[cfg(nccl_macro = "NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER")]
    {
        ncclDevCommRequirements_t::default()
    }
    #[cfg(not(nccl_macro = "NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER"))]
    {
        // SAFETY: plain C data (integers, booleans, null pointers): all zero is a valid value.
        unsafe { std::mem::zeroed() }
    }
}

/// A device communicator: the `ncclDevComm` a kernel takes by value ([`DevComm::get`]), made with the
/// resources `ncclDevCommRequirements_t` asks for (LSA barriers, multimem, GIN), destroyed
/// (`ncclDevCommDestroy`) by [`DevComm::destroy`], or when dropped on any other path.
#[derive(Debug)]
pub struct DevComm {
    comm: ncclComm_t,
    dev: ncclDevComm_t,
}

impl DevComm {
    /// `ncclDevCommCreate` on `comm` with `requirements` (start from [`requirements()`]). Collective:
    /// every rank of `comm` creates one, in the same order. With NCCL 2.29+, check the communicator first
    /// (`require_device_api`): a communicator without device API support fails here with NCCL's own,
    /// less telling, error.
    ///
    /// # Safety
    /// `comm` is a live communicator that outlives the device communicator (destroyed before `comm`);
    /// the lists `requirements` points to (resource and team requirements) are valid for the call.
    pub unsafe fn create(
        comm: ncclComm_t,
        requirements: &ncclDevCommRequirements_t,
    ) -> Result<DevComm, GpuError> {
        let mut dev = std::mem::MaybeUninit::<ncclDevComm_t>::zeroed();
        // SAFETY: the caller promises `comm` and the requirements' lists; NCCL writes one ncclDevComm.
        let result = unsafe { ncclDevCommCreate(comm, requirements, dev.as_mut_ptr()) };
        check_nccl(result, "ncclDevCommCreate")?;
        Ok(DevComm {
            comm,
            // SAFETY: zeroed, then written by a successful ncclDevCommCreate: plain bytes either way.
            dev: unsafe { dev.assume_init() },
        })
    }

    /// The device communicator, as a kernel takes it (by value).
    pub fn get(&self) -> &ncclDevComm_t {
        &self.dev
    }

    /// Destroys the device communicator, reporting how it went (dropping it does the same and ignores
    /// the status). Collective, like the creation.
    pub fn destroy(self) -> Result<(), GpuError> {
        let status = self.release();
        std::mem::forget(self);
        status
    }

    fn release(&self) -> Result<(), GpuError> {
        // SAFETY: made by ncclDevCommCreate on `comm`, which `create`'s caller keeps alive until then;
        // destroyed once (`destroy` forgets the value, so drop does not run after it).
        let result = unsafe { ncclDevCommDestroy(self.comm, &self.dev) };
        check_nccl(result, "ncclDevCommDestroy")
    }
}

impl Drop for DevComm {
    fn drop(&mut self) {
        // Nothing to report to on this path; `destroy` reports.
        let _ = self.release();
    }
}
